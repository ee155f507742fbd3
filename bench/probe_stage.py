"""Probe one cuTile stage: the production kernel and variant files of it, each checked against its reference
stage in float64, then timed side by side at the seed shape (or one layer of the medium model's training step,
--shape step or step_l8192). For tuning: copy kernels/cutile/<stage>.py
somewhere, change it, and probe both in one run (docs/kernels.md keeps what was tried).

    python -m bench.probe_stage bwd_dx                                 # the production kernel alone
    python -m bench.probe_stage bwd_dbc /tmp/bwd_dbc_v2.py --chunks 64,128 --calls 20
    python -m bench.probe_stage bwd_dbc --chunks 64 --sweep            # every configuration of its tune space
    python -m bench.probe_stage bwd_dbc --chunks 64 --shape step       # one layer's SSD in the medium model's step
    python -m bench.probe_stage fwd_pass_state --chunks 128 --shape n64   # the seed's shape with state 64
    python -m bench.probe_stage compute_out --chunks 128 --states float32,bfloat16   # fp32 and bf16 chunk states
    python -m bench.probe_stage bwd_dbc OLD.py --chunks 64 --shape step --documents stdlib --sweep   # with seq_idx

With --sweep each file's stage is tuned (a temporary tuning cache) and the time of every configuration of
its tune space at the timed shape is printed. Each row's float64 check runs the configuration that row
timed (without --sweep the file's default), forced at the check's shape: b 2, 16 heads in 2 groups (so
that splits of a group's heads divide), l 20·chunk + 37 (21 chunks, the last one short: a chunk loop split into
segments still has several).

The stages reading chunk states or their gradients (compute_out, bwd_dx, bwd_dbc) take them with bf16 inputs (the
timed shape and the bf16 check) in bf16, as fwd_pass_state and bwd_pass_state store them, or with --states in each
dtype listed, one row per dtype; the fp32 check keeps float32 states, as fp32 inputs store them.

--documents times the stages that mask by document with seq_idx: documents of that kind (bench.documents) packed
into the timed shape's rows. Their float64 check then takes short documents (64-256 tokens: boundaries in most
chunks, one on a chunk edge now and then), whatever kind is timed.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from bench.documents import DOCUMENTS, packed_seq_idx
from bench.inputs import stage_inputs
from bench.timing import wall_ms
from bench.variants import load_variant
from kernels import reference
from kernels import reference_backward as ref_bwd
from kernels.cutile import tuning

# stage -> (reference function, the names of its arguments in stage_inputs' dict; "chunk" is the chunk size)
STAGES: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "chunk_cumsum": (reference.chunk_cumsum, ("dt", "A", "chunk", "dt_bias", "softplus")),
    "fwd_pass_state": (reference.fwd_pass_state, ("x", "B", "dt_out", "dA_cumsum", "initial_states")),
    "compute_out": (reference.compute_out, ("x", "B", "C", "dt_out", "dA_cumsum", "chunk_states", "D")),
    "bwd_pass_state": (ref_bwd.bwd_pass_state, ("dy", "C", "dA_cumsum", "dfinal")),
    "bwd_dx": (ref_bwd.bwd_dx, ("x", "dy", "B", "C", "dt_out", "dA_cumsum", "dstates", "D")),
    "bwd_dbc": (ref_bwd.bwd_dbc, ("x", "dy", "B", "C", "dt_out", "dA_cumsum", "chunk_states", "dstates")),
    "chunk_cumsum_bwd": (
        ref_bwd.chunk_cumsum_bwd,
        ("ddt_dir", "da_intra", "da_inter", "dt_out", "dt", "A", "softplus", "dt_bias", "dD_parts"),
    ),
}
# timed shapes (bf16 inputs, head dim 64, state 128 unless said, one group): the seed article's, one layer of the
# medium model's training step (configs/medium.yaml: d_model 768, expand 2 -> 24 heads; L 2048, batch 8; or L 8192,
# batch 2), and the seed's with state 64 (bench_kernels' sweep is furthest behind its ratio target at head dim 64
# with state 64)
SHAPES = {
    "seed": {"b": 4, "l": 16384, "h": 8},
    "step": {"b": 8, "l": 2048, "h": 24},
    "step_l8192": {"b": 2, "l": 8192, "h": 24},
    "n64": {"b": 4, "l": 16384, "h": 8, "n": 64},
}
MASKING = ("fwd_pass_state", "compute_out", "bwd_pass_state", "bwd_dx", "bwd_dbc")  # take seq_idx last
ROWS = ("ddt_dir", "da_intra", "da_inter")  # chunk_cumsum_bwd's gradient rows: random, (b, h, c, Q) as dt_out
UPSTREAM = {"dt_out", "dA_cumsum", "chunk_states", "dstates", "D", "initial_states", "dfinal", "A", "dt_bias"}
UPSTREAM |= {"dD_parts", *ROWS}  # chunk_cumsum_bwd's
STATES = {"chunk_states", "dstates"}  # the upstream tensors --states sets the dtype of


def load(stage: str, path: str | None) -> Callable:
    """The stage's host function from the production module, or from a variant file of it."""
    if path is None:
        return getattr(importlib.import_module(f"kernels.cutile.{stage}"), stage)
    return getattr(load_variant(path), stage)


def inputs(chunk: int, dtype: torch.dtype = torch.bfloat16, p: int = 64, n: int = 128, **shape) -> dict:
    """stage_inputs (head dim p, state n) and random gradient rows and dD partial sums (h, b·c) for chunk_cumsum_bwd
    (float64, as the upstream)."""
    t = stage_inputs(dtype, chunk, p, n, **shape)
    g = torch.Generator(device=t["dt_out"].device).manual_seed(shape.get("seed", 0) + 7)
    t.update({name: torch.randn(t["dt_out"].shape, generator=g, device=g.device).double() for name in ROWS})
    b, h, c, _ = t["dt_out"].shape
    t["dD_parts"] = torch.randn(h, b * c, generator=g, device=g.device).double()
    return t


def arguments(t: dict, names: tuple[str, ...], chunk: int, exact: bool, states: torch.dtype = torch.bfloat16) -> list:
    """The stage's arguments: float64 everywhere for the reference, else the kernel's dtypes (fp32 upstream,
    chunk_states and dstates in `states`)."""
    out = []
    for name in names:
        v = {"chunk": chunk, "softplus": True}.get(name, t.get(name))
        if isinstance(v, torch.Tensor):
            if exact:
                v = v.double()
            elif name in STATES:
                v = v.to(states)
            elif name in UPSTREAM:
                v = v.float()
        out.append(v)
    return out


def documents(t: dict, kind: str) -> list:
    """The stage's trailing seq_idx argument for documents of `kind` packed into the rows of t's inputs: none for
    "none"."""
    b, l = t["x"].shape[:2]
    return [] if kind == "none" else [packed_seq_idx(kind, b, l, t["x"].device)]


def max_error(
    fn: Callable,
    stage: str,
    dtype: torch.dtype,
    chunk: int,
    states: torch.dtype = torch.bfloat16,
    kind: str = "none",
) -> float:
    """The largest relative error of the stage's outputs; chunk states in `states` with bf16 inputs, else float32;
    with short documents (seq_idx) unless `kind` is "none"."""
    ref, names = STAGES[stage]
    t = inputs(chunk, dtype, l=20 * chunk + 37, h=16, g=2, seed=chunk)
    states = states if dtype == torch.bfloat16 else torch.float32
    ids = documents(t, "none" if kind == "none" else "short")
    got, want = fn(*arguments(t, names, chunk, False, states), *ids), ref(*arguments(t, names, chunk, True), *ids)
    pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
    return max(((a.double() - b).norm() / b.norm()).item() for a, b in pairs if b is not None)


def time_ms(
    fn: Callable,
    stage: str,
    chunk: int,
    calls: int,
    shape: str = "seed",
    states: torch.dtype = torch.bfloat16,
    kind: str = "none",
) -> float:
    t = inputs(chunk, **SHAPES[shape], g=1, seed=0)
    args = arguments(t, STAGES[stage][1], chunk, False, states) + documents(t, kind)
    fn(*args)  # compile and, with --sweep, tune before timing
    return wall_ms(lambda: fn(*args), calls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=sorted(STAGES))
    ap.add_argument("variants", nargs="*", help="files holding a changed copy of kernels/cutile/<stage>.py")
    ap.add_argument("--chunks", default="64,128")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="tune, printing every configuration's time")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="seed", help="the timed shape")
    ap.add_argument("--documents", choices=DOCUMENTS, default="none", help="packed documents (seq_idx) timed")
    ap.add_argument(
        "--states",
        default="bfloat16",
        help="dtypes of the chunk states / state gradients fed with bf16 inputs (bfloat16, float32; comma-separated;"
        " default bfloat16, as production stores them)",
    )
    args = ap.parse_args(argv)
    state_dtypes = [getattr(torch, name, None) for name in args.states.split(",")]
    if any(d not in (torch.float32, torch.bfloat16) for d in state_dtypes):
        ap.error(f"--states takes float32 and/or bfloat16, got {args.states!r}")
    if state_dtypes != [torch.bfloat16] and not STATES & set(STAGES[args.stage][1]):
        ap.error(f"--states applies to the stages reading chunk states: compute_out, bwd_dx, bwd_dbc, not {args.stage}")
    if args.documents != "none" and args.stage not in MASKING:
        ap.error(f"--documents applies to the stages that mask by document: {', '.join(MASKING)}, not {args.stage}")
    if not torch.cuda.is_available():
        print("probe_stage needs a CUDA GPU", file=sys.stderr)
        return 2
    dims = " ".join(f"{k} {v}" for k, v in {"p": 64, "g": 1, "n": 128, **SHAPES[args.shape]}.items())
    docs = "" if args.documents == "none" else f", {args.documents} documents"
    print(f"kernels.cutile.{args.stage}, {args.shape} shape {dims} bf16{docs}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="probe_stage_"))
    if args.sweep:
        tuning.sweep_verbosely()
    for i, path in enumerate([None, *args.variants]):
        fn = load(args.stage, path)
        for states, chunk in itertools.product(state_dtypes, (int(c) for c in args.chunks.split(","))):
            # A fresh tuning cache per file and states dtype (the tuning key does not hold the latter): each
            # launches its own default (nothing cached on this machine is reused), or with --sweep is tuned afresh.
            tuning.set_cache_path(scratch / f"tuning{i}_{str(states)[6:]}.json")
            with tuning.forced(args.stage) as launched:
                ms = time_ms(fn, args.stage, chunk, args.calls, args.shape, states, args.documents)
            if not launched:
                print(f"{path}: its {args.stage} launched nothing through kernels.cutile.launch", file=sys.stderr)
                return 2
            with tuning.forced(args.stage, launched[-1]):
                e16, e32 = (
                    max_error(fn, args.stage, d, chunk, states, args.documents) for d in (torch.bfloat16, torch.float32)
                )
            label = "" if len(state_dtypes) == 1 and states == torch.bfloat16 else f"  states {str(states)[6:]}"
            print(
                f"{path or 'production':28s} chunk {chunk:3d}{label}  {ms:8.3f} ms  rel err bf16 {e16:.1e} "
                f"fp32 {e32:.1e}  {launched[-1]}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
