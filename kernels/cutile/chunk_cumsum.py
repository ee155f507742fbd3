"""Stage 1 of the SSD forward in cuTile: dt processing and the per-chunk cumulative sum of dt * A.

Reference: `kernels.reference.chunk_cumsum`. Differences, both for the consumers' sake:
  * outputs are [batch, head, token] (token contiguous), one row of c * Q tokens per (batch, head);
  * dA_cumsum is in log2 units (multiplied by log2(e)) so later stages use exp2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.tile as ct
import torch

LOG2E = math.log2(math.e)
SOFTPLUS_THRESHOLD = 20.0  # as torch.nn.functional.softplus: identity above it

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def chunk_cumsum_kernel(
    dt,  # (b, l, h) any float dtype
    A,  # (h,) float32
    dt_bias,  # (h,) float32 (ignored unless HAS_BIAS)
    dt_out,  # (b, h, c * Q) float32
    dA_cumsum,  # (b, h, c * Q) float32, log2 units
    seqlen: int,
    Q: ConstInt,
    TILE_H: ConstInt,
    HAS_BIAS: ConstBool,
    SOFTPLUS: ConstBool,
):
    bi = ct.bid(0)
    ci = ct.bid(1)
    hj = ct.bid(2)
    d = ct.load(dt, index=(bi, ci, hj), shape=(1, Q, TILE_H), padding_mode=ct.PaddingMode.ZERO, latency=4).reshape(
        (Q, TILE_H)
    )
    d = d.astype(ct.float32)
    if HAS_BIAS:
        bias = ct.load(dt_bias, index=(hj,), shape=(TILE_H,), padding_mode=ct.PaddingMode.ZERO)
        d = d + bias.reshape((1, TILE_H))
    if SOFTPLUS:
        soft = ct.log(1.0 + ct.exp(ct.minimum(d, SOFTPLUS_THRESHOLD)))
        d = ct.where(d > SOFTPLUS_THRESHOLD, d, soft)
    # Tokens past the sequence end get dt = 0: no decay and no contribution downstream.
    token = ci * Q + ct.arange(Q, dtype=ct.int32).reshape((Q, 1))
    d = ct.where(token < seqlen, d, 0.0)
    a = ct.load(A, index=(hj,), shape=(TILE_H,), padding_mode=ct.PaddingMode.ZERO).reshape((1, TILE_H))
    g = ct.cumsum(d * (a * LOG2E), axis=0)
    ct.store(dt_out, index=(bi, hj, ci), tile=ct.transpose(d).reshape((1, TILE_H, Q)))
    ct.store(dA_cumsum, index=(bi, hj, ci), tile=ct.transpose(g).reshape((1, TILE_H, Q)))


@dataclass(frozen=True)
class CumsumConfig:
    """Heads handled by one chunk_cumsum program (a power of two)."""

    TILE_H: int = 8


def search_space(nheads: int) -> list[CumsumConfig]:
    """Configurations worth timing for this number of heads."""
    top = 1 << (nheads - 1).bit_length()
    return [CumsumConfig(th) for th in (1, 2, 4, 8, 16) if th <= top]


def spec(
    cfg: CumsumConfig,
    dt: torch.Tensor,
    A: torch.Tensor,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    chunk_size: int,
) -> tuple[tuple[int, ...], object, tuple]:
    """(grid, kernel, args) of stage 1 writing dt_out and dA_cumsum, both (b, h, c * Q) float32.

    dt: (b, l, h) any float dtype; A, dt_bias: (h,) float32.
    """
    b, seqlen, h = dt.shape
    nchunks = dt_out.shape[-1] // chunk_size
    th = min(cfg.TILE_H, 1 << (h - 1).bit_length())
    grid = (b, nchunks, -(-h // th))
    bias = A if dt_bias is None else dt_bias
    args = (dt, A, bias, dt_out, dA_cumsum, seqlen, chunk_size, th, dt_bias is not None, dt_softplus)
    return grid, chunk_cumsum_kernel, args
