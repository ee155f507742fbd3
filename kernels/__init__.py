"""The Mamba-2 SSD: one entry point, several backends.

    y, final_state = kernels.ssd(x, dt, A, B, C, chunk_size, D=None, dt_bias=None, dt_softplus=False,
                                 initial_states=None, return_final_states=True, backend="auto")

The signature follows mamba_ssm's `mamba_chunk_scan_combined`, so code written for it can swap in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.backends import BACKENDS, implementation, resolve, unavailable_reason
from kernels.timing import ssd_timer, timed

__all__ = ["BACKENDS", "resolve", "ssd", "ssd_timer", "unavailable_reason"]


def _check_shapes(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None,
    dt_bias: Tensor | None,
    initial_states: Tensor | None,
) -> None:
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


def ssd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: Tensor | None = None,
    return_final_states: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """The chunked SSD scan of Mamba-2.

    Args:
        x: (b, l, h, p) inputs per head.   dt: (b, l, h) time steps (raw if dt_softplus).
        A: (h,) decay rates (negative).    B, C: (b, l, g, n), h % g == 0; head i reads group i // (h // g).
        chunk_size: tokens per chunk; l need not be a multiple of it.
        D: (h,) skip connection.  dt_bias: (h,) added to dt before softplus.
        initial_states: (b, h, p, n) state before the first token.
        backend: "torch", "cutile", "triton" or "auto" (cutile on a CUDA GPU where it runs, else torch).
    Returns:
        y (b, l, h, p) in x's dtype, and with return_final_states the state after the last token
        (b, h, p, n), float32 (float64 for float64 inputs on the torch backend).
    """
    _check_shapes(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states)
    name = resolve(backend, x.device.type, x.device.index)
    fn = implementation(name)

    def run(x: Tensor, dt: Tensor, B: Tensor, C: Tensor) -> tuple[Tensor, Tensor]:
        return fn(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states)

    with torch.autocast(x.device.type, enabled=False):  # each backend picks its own precisions
        y, final_state = timed(run, x, dt, B, C)
    return (y, final_state) if return_final_states else y
