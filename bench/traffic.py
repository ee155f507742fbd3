"""The memory floor of each cuTile SSD stage: the HBM bytes its kernel must move at a shape.

A stage's floor counts each tensor its kernel loads as read once and each tensor it stores as written once, at the
size its host function allocates; re-reads (a tile loaded by several programs) are the kernel's own cost, not the
floor's. With c = ⌈l / Q⌉ chunks (the per-token float32 arrays are allocated padded to c·Q tokens):

    stage           reads                                                   writes
    chunk_cumsum    dt (b, l, h), A and dt_bias (h,)                        dt_out, dA_cumsum (b, h, c·Q); the
                                                                            backward's also dA_cumsum·log2(e)
    fwd_pass_state  x (b, l, h, p), B (b, l, g, n), dt_out, dA_cumsum,      chunk_states (b, c, h, p, n),
                    initial_states (b, h, p, n) if given                    final_state (b, h, p, n)
    compute_out     x, B, C (b, l, g, n), dt_out, dA_cumsum, chunk_states,  y (b, l, h, p)
                    D (h,) if given
    bwd_pass_state  dy (b, l, h, p), C, dA_cumsum,                          dstates (b, c, h, p, n),
                    dfinal_state (b, h, p, n) if given                      dinitial_states (b, h, p, n)
    state_walks     fwd_pass_state's and bwd_pass_state's, dA_cumsum once   both's
    bwd_dx          x, dy, B, C, dt_out, dA_cumsum, dstates, D if given     dx (b, l, h, p), ddt_dir and da_intra
                                                                            (b, h, c·Q), dD_part (h, b·c)
    bwd_dbc         x, dy, B, C, dt_out, dA_cumsum, chunk_states, dstates   dB, dC (b, l, g, n),
                                                                            da_inter (blocks, b, h, c·Q)
    chunk_cumsum_bwd  ddt_dir, da_intra, da_inter (summed over its          ddt (b, l, h) in dt's dtype,
                    blocks), dt_out, A; with softplus dt (b, l, h) and      partial sums (3, h, b·c)
                    dt_bias (h,) if given; dD_part if D is given

x, dy, y, dx, B, C, dB, dC are in the input dtype, dt in `dt_dtype` (float32 as bench/bench_kernels.py passes it),
chunk_states and dstates in bfloat16 with bfloat16 inputs (as fwd_pass_state and bwd_pass_state store them), else
float32, everything else float32. bwd_dbc writes one da_inter row per block of state columns: ⌈n / TILE_N⌉ blocks, one in the
default configuration (DbcConfig: all state columns in one program).

Against a four-pass backward design's floor at the same Q (A: one kernel recomputing dt, Λ and the chunk states
from dt; B: the reverse state pass; C: per (chunk, head); D: per (chunk, group), looping over the group's heads),
with a "row" one float32 value per (batch, head, token), b·h·c·Q of them:
- A is chunk_cumsum + fwd_pass_state here: two rows more (fwd_pass_state reads dt_out and dA_cumsum back instead of
  recomputing them) and the final state, which fwd_pass_state always writes; chunk_cumsum also writes
  dA_cumsum·log2(e), one row more, which bwd_dx reads in place of dA_cumsum with bf16 inputs.
- B is bwd_pass_state, which also writes d initial_states and, given a final-state gradient, reads it.
- C is bwd_dx, which writes da_intra beside ddt_dir (C folds A·da into one ddt array): one row more.
- D is bwd_dbc, which does not read C's ddt array back (one row fewer) and writes da_inter where D writes d dt_raw;
  chunk_cumsum_bwd then reads four rows and writes d dt_raw with the partial sums for dA and d dt_bias beside
  a copy of dD's (from bwd_dx), which one torch.sum finishes.
Beyond these, the cuTile backward runs at its own chunk size (kernels.cutile.launch.BACKWARD_CHUNK) where such a design
takes the forward's: at half the forward's Q, twice the chunks, so twice the bytes of chunk_states and dstates, the
largest tensors bwd_pass_state, bwd_dx and bwd_dbc move.

`profiled` reads the stage and the specialization constants (Q, TILE_N, HAS_D, ...) off a profiled cuTile kernel's
name, so that `stage_traffic(stage, shape, constants)` takes a kernel's floor at its own chunk size.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

STAGES = (
    "chunk_cumsum",
    "fwd_pass_state",
    "compute_out",
    "bwd_pass_state",
    "state_walks",
    "bwd_dx",
    "bwd_dbc",
    "chunk_cumsum_bwd",
)
F32 = torch.float32.itemsize  # dt_out, dA_cumsum, states and the other float32 arrays


@dataclass(frozen=True)
class SSDShape:
    """One SSD problem: x (batch, seqlen, nheads, headdim), B and C (batch, seqlen, ngroups, dstate) in `dtype`,
    dt (batch, seqlen, nheads) in `dt_dtype`, chunks of `chunk_size` tokens. The fields of a bench_kernels record's
    "shape" (`SSDShape.of(record["shape"])`)."""

    batch: int
    seqlen: int
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    chunk_size: int
    dtype: str
    dt_dtype: str = "float32"

    @classmethod
    def of(cls, shape: Mapping) -> SSDShape:
        """The shape from a mapping holding at least its fields without defaults (other keys are ignored)."""
        return cls(**{f.name: shape[f.name] for f in dataclasses.fields(cls) if f.name in shape})


@dataclass(frozen=True)
class Traffic:
    """Bytes read and written."""

    read: int
    write: int

    @property
    def total(self) -> int:
        return self.read + self.write


def itemsize(dtype: str) -> int:
    """Bytes per element of a torch dtype named as in torch ("bfloat16", "float32", ...)."""
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; name a torch dtype such as bfloat16 or float32")
    return dt.itemsize


def ssd_io(shape: SSDShape) -> Traffic:
    """The SSD forward's inputs read once and y written once: x, B, C, y in dtype; dt in dt_dtype; A, D, dt_bias."""
    s, e = shape, itemsize(shape.dtype)
    tokens = s.batch * s.seqlen
    read = e * tokens * (s.nheads * s.headdim + 2 * s.ngroups * s.dstate)
    read += itemsize(s.dt_dtype) * tokens * s.nheads + 3 * F32 * s.nheads
    return Traffic(read, e * tokens * s.nheads * s.headdim)


def stage_traffic(stage: str, shape: SSDShape, constants: Mapping[str, int | bool] | None = None) -> Traffic:
    """The bytes `stage`'s kernel must read and write at `shape` (the module docstring lists its tensors).

    constants: the kernel's specialization (as `profiled` reads it): Q, the chunk size (default shape.chunk_size);
    HAS_BIAS, HAS_D, HAS_INIT, HAS_DFINAL, whether dt_bias, D, initial_states, dfinal_state are read (default: dt_bias
    and D given, no initial state, no final-state gradient, as bench/bench_kernels.py calls the SSD); LOG2, whether
    chunk_cumsum writes dA_cumsum·log2(e) too (default: no, as the forward's launch); SOFTPLUS,
    whether chunk_cumsum_bwd reads dt back (default: yes, as the model and bench/bench_kernels.py call it); TILE_N,
    bwd_dbc's state columns per program (default: all of them, one block).
    """
    from kernels.cutile.fwd_pass_state import states_dtype

    k = dict(constants or {})
    b, l, h, p, g, n = shape.batch, shape.seqlen, shape.nheads, shape.headdim, shape.ngroups, shape.dstate
    Q = k.get("Q", shape.chunk_size)
    c = math.ceil(l / Q)
    e = itemsize(shape.dtype)
    heads = e * b * l * h * p  # x, dy, y, dx
    groups = e * b * l * g * n  # B, C, dB, dC
    rows = F32 * b * h * c * Q  # dt_out, dA_cumsum, ddt_dir, da_intra, one block of da_inter
    states = states_dtype(getattr(torch, shape.dtype)).itemsize * b * c * h * p * n  # chunk_states, dstates
    state = F32 * b * h * p * n  # initial_states, final_state, dfinal_state, dinitial_states
    vector = F32 * h  # A, D, dt_bias
    dt = itemsize(shape.dt_dtype) * b * l * h  # dt, ddt
    if stage == "chunk_cumsum":
        return Traffic(dt + vector + vector * k.get("HAS_BIAS", True), (2 + k.get("LOG2", False)) * rows)
    if stage == "fwd_pass_state":
        return Traffic(heads + groups + 2 * rows + state * k.get("HAS_INIT", False), states + state)
    if stage == "compute_out":
        return Traffic(heads + 2 * groups + 2 * rows + states + vector * k.get("HAS_D", True), heads)
    if stage == "bwd_pass_state":
        return Traffic(heads + groups + rows + state * k.get("HAS_DFINAL", False), states + state)
    if stage == "state_walks":  # the two walks in one launch: dA_cumsum, which both read, counted once
        walks = [stage_traffic(s, shape, constants) for s in ("fwd_pass_state", "bwd_pass_state")]
        return Traffic(sum(t.read for t in walks) - rows, sum(t.write for t in walks))
    if stage == "bwd_dx":
        read = 2 * heads + 2 * groups + 2 * rows + states + vector * k.get("HAS_D", True)
        return Traffic(read, heads + 2 * rows + F32 * b * c * h)
    if stage == "bwd_dbc":
        blocks = math.ceil(n / k.get("TILE_N", n))
        return Traffic(2 * heads + 2 * groups + 2 * rows + 2 * states, 2 * groups + blocks * rows)
    if stage == "chunk_cumsum_bwd":
        softplus = k.get("SOFTPLUS", True)  # the raw dt and dt_bias are read for the softplus factor only
        read = 4 * rows + vector + (vector * k.get("HAS_BIAS", True) + dt) * softplus
        read += F32 * b * c * h * k.get("HAS_D", True)
        return Traffic(read, dt + 3 * F32 * b * c * h)
    raise ValueError(f"unknown stage {stage!r}; the cuTile stages are {', '.join(STAGES)}")


@dataclass(frozen=True)
class Profiled:
    """A profiled cuTile SSD kernel: its stage and specialization constants (parameter name -> value); constants
    is None when the name's parameters are not those of the stage's kernel here (a profile of another version)."""

    stage: str
    constants: dict[str, int | bool] | None


@functools.cache
def kernel_parameters(stage: str) -> tuple[str, ...]:
    """The parameter names of `<stage>_kernel`, in order, read from kernels/cutile/<stage>.py's source."""
    tree = ast.parse((Path(__file__).parents[1] / "kernels" / "cutile" / f"{stage}.py").read_text())
    (kernel,) = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == f"{stage}_kernel"]
    return tuple(a.arg for a in kernel.args.args)


# Parameter lists a stage's kernel had before its present one, so that names recorded in results/ before a change
# still parse: chunk_cumsum_kernel without dA_log2 and LOG2 (before c657576); chunk_cumsum_bwd_kernel without
# dD_part and HAS_D (before 4d9319c; its floor is then the present kernel's, which also copies dD's partial sums);
# fwd_pass_state_kernel without STEP (before cc2b2d3: one chunk an iteration).
FORMER_PARAMETERS = {
    "fwd_pass_state": (
        ("x", "B", "dt_out", "dA_cumsum", "initial_states", "chunk_states", "final_state", "NHEADS")
        + ("HEADS_PER_GROUP", "Q", "TILE_P", "TILE_N", "HAS_INIT", "TF32", "LATENCY"),
    ),
    "chunk_cumsum": (("dt", "A", "dt_bias", "dt_out", "dA_cumsum", "seqlen", "Q", "TILE_H", "HAS_BIAS", "SOFTPLUS"),),
    "chunk_cumsum_bwd": (
        ("ddt_dir", "da_intra", "da_inter", "dt_out", "dt", "A", "dt_bias", "ddt", "partials", "seqlen", "Q")
        + ("TILE_H", "HAS_BIAS", "SOFTPLUS"),
    ),
}


def profiled(name: str) -> Profiled | None:
    """The stage and constants of a cuTile SSD kernel from its name as a profiler lists it (cuTile's mangled
    symbol: the kernel's name, then one code per parameter); None for any other kernel."""
    from cuda.tile.compilation import ConstantConstraint, demangle_kernel_name

    try:
        function, signature = demangle_kernel_name(name)
    except ValueError:
        return None
    stage = function.removesuffix("_kernel")
    if stage not in STAGES or function == stage:
        return None
    lists = (kernel_parameters(stage), *FORMER_PARAMETERS.get(stage, ()))
    names = next((n for n in lists if len(n) == len(signature.parameters)), None)
    if names is None:
        return Profiled(stage, None)
    return Profiled(
        stage, {n: c.value for n, c in zip(names, signature.parameters) if isinstance(c, ConstantConstraint)}
    )
