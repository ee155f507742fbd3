"""The standin backend of `kernels.ssd`, for the bench only: the SSD replaced by y = x·D.

A training step with this backend is the rest of the step alone (projections, conv, norms, loss, optimizer, and
kernels.ssd's own entry), so that a benchmark finds the SSD's share of a step by subtraction (bench/bench_step.py).
Its inputs and outputs have the SSD's shapes and dtypes, and autograd gives its backward: dx = dy·D, dD = Σ dy·x;
dt, A, B, C, dt_bias and the initial state receive no gradient. It is no model of anything: never train with it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ssd_standin(
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
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """y = x·D (b, l, h, p) in x's dtype (x itself, copied, without D) and a zero final state (b, h, p, n) float32,
    a broadcast view of one zero: no memory is filled. seq_idx changes nothing: no token reads another."""
    b, _, h, p = x.shape
    y = x.clone() if D is None else x * D.to(x.dtype)[:, None]
    return y, x.new_zeros((), dtype=torch.float32).expand(b, h, p, B.shape[-1])
