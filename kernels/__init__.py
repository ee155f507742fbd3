"""The Mamba-2 SSD: one entry point, several backends.

    y, final_state = kernels.ssd(x, dt, A, B, C, chunk_size, D=None, *, dt_bias=None, dt_softplus=False,
                                 initial_states=None, seq_idx=None, return_final_states=False, backend="auto",
                                 backward="reference")

The arguments it takes are mamba_ssm's `mamba_chunk_scan_combined`'s, by the same names and meanings: x, dt, A, B,
C, chunk_size and D by position, the rest by keyword (mamba_ssm's positions differ: z comes after D). It takes no z,
cu_seqlens or dt_limit. `seq_idx` marks packed documents, with mamba_ssm's meaning, on every backend. Backends and
how one is chosen: kernels/backends.py. Also here: `set_autotune` (cuTile block-size search per shape) and
`tuning_choices` (the cuTile configurations this process decided on, for the record).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.backends import BACKENDS, BACKWARDS, cutile_runs, implementation, resolve, unavailable_reason
from kernels.cutile.tuning import chosen as tuning_choices
from kernels.cutile.tuning import set_autotune
from kernels.timing import ssd_timer, timed

__all__ = [
    "BACKENDS",
    "BACKWARDS",
    "cutile_runs",
    "resolve",
    "set_autotune",
    "ssd",
    "ssd_timer",
    "tuning_choices",
    "unavailable_reason",
]


def _check_shapes(tensors: dict[str, Tensor | None], chunk_size: int) -> None:
    """Raise ValueError naming the input whose shape or dtype does not fit the others.

    Args:
        tensors: the SSD's tensor inputs by name (x, dt, A, B, C, D, dt_bias, initial_states, seq_idx; None where
            absent).
    """
    x, dt, A, B, C = (tensors[k] for k in ("x", "dt", "A", "B", "C"))
    D, dt_bias, initial_states, seq_idx = (tensors[k] for k in ("D", "dt_bias", "initial_states", "seq_idx"))
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
    b, l, h, p = x.shape
    if dt.shape != (b, l, h):
        raise ValueError(f"dt must be (batch, seqlen, nheads) = {(b, l, h)}, got {tuple(dt.shape)}")
    if A.shape != (h,):
        raise ValueError(f"A must be (nheads,) = {(h,)}, got {tuple(A.shape)}")
    if B.dim() != 4 or B.shape[:2] != (b, l):
        raise ValueError(
            f"B must be (batch, seqlen, ngroups, dstate) with batch, seqlen = {b, l}, got {tuple(B.shape)}"
        )
    if C.shape != B.shape:
        raise ValueError(f"C must have B's shape {tuple(B.shape)}, got {tuple(C.shape)}")
    g, n = B.shape[2:]
    if g < 1 or h % g != 0:
        raise ValueError(f"nheads ({h}) must be divisible by ngroups ({g})")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if D is not None and D.shape != (h,):
        raise ValueError(f"D must be (nheads,) = {(h,)}, got {tuple(D.shape)}")
    if dt_bias is not None and dt_bias.shape != (h,):
        raise ValueError(f"dt_bias must be (nheads,) = {(h,)}, got {tuple(dt_bias.shape)}")
    if initial_states is not None and initial_states.shape != (b, h, p, n):
        raise ValueError(
            f"initial_states must be (batch, nheads, headdim, dstate) = {(b, h, p, n)}, "
            f"got {tuple(initial_states.shape)}"
        )
    if seq_idx is not None and (seq_idx.shape != (b, l) or seq_idx.dtype != torch.int32):
        raise ValueError(
            f"seq_idx must be (batch, seqlen) = {(b, l)} int32, got {tuple(seq_idx.shape)} {seq_idx.dtype}"
        )
    for name, t in tensors.items():
        if t is not None and name != "seq_idx" and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if B.dtype != C.dtype:
        raise ValueError(f"B and C must share a dtype, got {B.dtype} and {C.dtype}")


def _check_values(A: Tensor) -> None:
    """A must be negative: a positive A makes the state grow without bound (exp(dt * A) > 1).

    On CPU tensors only (on a GPU the check would make the host wait for the device), and not while torch.compile
    traces (a data-dependent branch would break the graph).
    """
    if torch.compiler.is_compiling() or A.device.type != "cpu":
        return
    if bool((A >= 0).any()):  # NaN is left to the loss's own check (training stops on a non-finite loss)
        raise ValueError(
            f"A must be negative (the state decays by exp(dt * A)); got max(A) = {A.max().item():.4g}. "
            "Mamba-2 parameterizes it as A = -exp(A_log): 0 there means A_log went to -inf, a diverged "
            "run (a lower learning rate may help)."
        )


def ssd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    *,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
    return_final_states: bool = False,
    backend: str = "auto",
    backward: str = "reference",
) -> Tensor | tuple[Tensor, Tensor]:
    """The chunked SSD scan of Mamba-2.

    Args:
        x: (b, l, h, p) inputs per head.   dt: (b, l, h) time steps (raw if dt_softplus).
        A: (h,) decay rates (negative).    B, C: (b, l, g, n), h % g == 0; head i reads group i // (h // g).
        chunk_size: tokens per chunk; l need not be a multiple of it.
        D: (h,) skip connection.  dt_bias: (h,) added to dt before softplus.
        initial_states: (b, h, p, n) state before the first token.
        seq_idx: (b, l) int32 document ids of packed sequences, non-decreasing along each row: where it changes
            the state restarts from zero, as if each document ran alone; the initial state belongs to document 0
            (mamba_ssm's meaning). Not checked for order (that would make the host wait for the device).
        backend: "torch", "cutile", "triton" or "auto" (cutile on a CUDA GPU where it runs, else torch); "standin"
            (y = x·D, kernels/standin.py) is for benchmarks only.
        backward: the cutile backend's gradient: "reference" (autograd through kernels.reference, the
            design this project measures) or "cutile" (the backward kernels). The other backends have their own
            backward and take only "reference"; "cutile" with backend "auto" is refused where auto picks torch.
    Returns:
        y (b, l, h, p) in x's dtype, and with return_final_states the state after the last token
        (b, h, p, n), float32 (float64 for float64 inputs on the torch backend); with seq_idx, the state of each
        row's last document.
    """
    tensors = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "dt_bias": dt_bias, "initial_states": initial_states}
    _check_shapes(tensors | {"seq_idx": seq_idx}, chunk_size)
    _check_values(A)
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {', '.join(BACKWARDS)}, got {backward!r}")
    name = resolve(backend, x.device.type, x.device.index)
    if backward == "cutile" and name != "cutile":
        runs = f"backend {backend!r} runs {name} here" if backend != name else f"the {name} backend"
        raise ValueError(f"backward='cutile' needs the cutile backend; {runs}, which has its own backward")
    fn = implementation(name)
    extra = (backward,) if name == "cutile" else ()

    def run(x: Tensor, dt: Tensor, B: Tensor, C: Tensor) -> tuple[Tensor, Tensor]:
        return fn(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, seq_idx, *extra)

    with torch.autocast(x.device.type, enabled=False):  # each backend picks its own precisions
        y, final_state = timed(run, x, dt, B, C)
    return (y, final_state) if return_final_states else y
