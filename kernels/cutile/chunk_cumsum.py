"""Stage 1 of the SSD forward in cuTile: dt processing and the per-chunk cumulative sum of dt * A.

Reference: `kernels.reference.chunk_cumsum`; the host function `chunk_cumsum` takes and returns what
the reference does: dt_out and dA_cumsum (b, h, c, Q) float32, dA_cumsum in natural-log units. The
kernel writes them as one row of c * Q tokens per (batch, head), the same memory. compute_out and
bwd_pass_state scale dA_cumsum by log2(e) where they load it and use exp2; fwd_pass_state and bwd_dbc use
exp on it directly, which measured faster there (docs/kernels.md, fwd_pass_state and bwd_dbc). bwd_dx takes
it in log2 units with bf16 inputs: `chunk_cumsum_log2`, the backward's stage 1, writes dA_cumsum·log2(e) as
a third row in the same launch (the backward's elementwise multiply on the host before).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import cuda.tile as ct
import torch
from cuda.tile.compilation import KernelSignature

from kernels.cutile.launch import BACKWARD_CHUNK, ConstBool, ConstInt, launch, next_pow2
from kernels.cutile.signature import DTYPES, Specialization, array, kernel_signature, scalar

LOG2E = math.log2(math.e)  # exp(v) = exp2(v * LOG2E) in the stages that use exp2
SOFTPLUS_THRESHOLD = 20.0  # as torch.nn.functional.softplus: identity above it


@ct.kernel
def chunk_cumsum_kernel(
    dt,  # (b, l, h) any float dtype
    A,  # (h,) float32
    dt_bias,  # (h,) float32 (ignored unless HAS_BIAS)
    dt_out,  # (b, h, c * Q) float32
    dA_cumsum,  # (b, h, c * Q) float32
    dA_log2,  # (b, h, c * Q) float32, dA_cumsum·log2(e) (written only with LOG2)
    seqlen: int,
    Q: ConstInt,
    TILE_H: ConstInt,
    HAS_BIAS: ConstBool,
    SOFTPLUS: ConstBool,
    LOG2: ConstBool,
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
    g = ct.cumsum(d * a, axis=0)
    ct.store(dt_out, index=(bi, hj, ci), tile=ct.transpose(d).reshape((1, TILE_H, Q)))
    ct.store(dA_cumsum, index=(bi, hj, ci), tile=ct.transpose(g).reshape((1, TILE_H, Q)))
    if LOG2:  # the float32 product the host's dA_cumsum * LOG2E computed
        ct.store(dA_log2, index=(bi, hj, ci), tile=ct.transpose(g * LOG2E).reshape((1, TILE_H, Q)))


@dataclass(frozen=True)
class CumsumConfig:
    """Heads handled by one chunk_cumsum program (a power of two)."""

    TILE_H: int = 8


def search_space(nheads: int) -> list[CumsumConfig]:
    """Configurations worth timing for this number of heads."""
    return [CumsumConfig(th) for th in (1, 2, 4, 8, 16) if th <= next_pow2(nheads, floor=1)]


def cumsum_signature(dtype: object, chunk: int, softplus: bool, log2: bool = False) -> KernelSignature:
    """chunk_cumsum_kernel's signature: dt in `dtype`, A and dt_bias, the three (b, h, c·Q) float32 rows, seqlen,
    the chunk, CumsumConfig's heads a program, dt_bias given, softplus and log2 as named."""
    f32 = ct.float32
    return kernel_signature(
        [array(dtype, 3), array(f32, 1), array(f32, 1)]
        + [array(f32, 3)] * 3
        + [scalar(), chunk, CumsumConfig().TILE_H, True, softplus, log2]
    )


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles: the forward's at chunk 128 in every dtype, with and without softplus; the
    backward's (`chunk_cumsum_log2`, with its log2(e) row) at the backward's chunk size."""
    for name, dtype in DTYPES.items():
        for softplus in (False, True):
            yield (
                f"chunk_cumsum[{name},softplus={softplus}]",
                chunk_cumsum_kernel,
                cumsum_signature(dtype, 128, softplus),
            )
    chunk = BACKWARD_CHUNK
    for name, dtype in DTYPES.items():
        label = f"chunk_cumsum[{name},Q={chunk},softplus=True,log2=True]"
        yield label, chunk_cumsum_kernel, cumsum_signature(dtype, chunk, True, log2=True)


def head_params(A: torch.Tensor, dt_bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A and dt_bias as the per-head kernels (this one and chunk_cumsum_bwd) read them: (h,) float32, contiguous.
    Without dt_bias, A stands in for it (the kernel does not read it then)."""
    A32 = A.to(torch.float32).contiguous()
    return A32, A32 if dt_bias is None else dt_bias.to(torch.float32).contiguous()


def head_grid(b: int, nchunks: int, h: int, tile_h: int) -> tuple[tuple[int, int, int], int]:
    """One program per (batch, chunk, head tile): the grid and TILE_H, capped at the heads' power of two."""
    th = min(tile_h, next_pow2(h, floor=1))
    return (b, nchunks, -(-h // th)), th


def dt_key(dt: torch.Tensor, chunk_size: int) -> str:
    """The tuning key of the per-head kernels: dt (b, l, h), chunk size, dt's dtype."""
    b, seqlen, h = dt.shape
    return f"b{b}_l{seqlen}_h{h}_Q{chunk_size}_{str(dt.dtype)[6:]}"


def _chunk_cumsum(
    dt: torch.Tensor,
    A: torch.Tensor,
    chunk_size: int,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    log2: bool,
) -> tuple[torch.Tensor, ...]:
    """dt_out, dA_cumsum and, with `log2`, dA_cumsum·log2(e): (b, h, c, Q) float32 each, from one launch."""
    b, seqlen, h = dt.shape
    nchunks = -(-seqlen // chunk_size)
    dt_out = torch.empty((b, h, nchunks * chunk_size), device=dt.device, dtype=torch.float32)
    dA_cumsum = torch.empty_like(dt_out)
    dA_log2 = torch.empty_like(dt_out) if log2 else dA_cumsum  # dA_cumsum stands in (the kernel does not write it)
    A32, bias32 = head_params(A, dt_bias)

    def spec(cfg: CumsumConfig) -> tuple[tuple[int, ...], object, tuple]:
        grid, th = head_grid(b, nchunks, h, cfg.TILE_H)
        args = (dt, A32, bias32, dt_out, dA_cumsum, dA_log2, seqlen, chunk_size, th, dt_bias is not None, dt_softplus)
        return grid, chunk_cumsum_kernel, (*args, log2)

    launch("chunk_cumsum", dt_key(dt, chunk_size), CumsumConfig(), lambda: search_space(h), spec, dt.device)
    shape = (b, h, nchunks, chunk_size)
    return tuple(t.view(shape) for t in ((dt_out, dA_cumsum, dA_log2) if log2 else (dt_out, dA_cumsum)))


def chunk_cumsum(
    dt: torch.Tensor,
    A: torch.Tensor,
    chunk_size: int,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 on the GPU. Same contract as `kernels.reference.chunk_cumsum`.

    Args:
        dt: (b, l, h) raw time steps, any float dtype.  A, dt_bias: (h,).
    Returns:
        dt_out: (b, h, c, Q) float32 processed dt, 0 on padding tokens.
        dA_cumsum: (b, h, c, Q) float32 cumulative sum of dt_out * A along each chunk.
    """
    dt_out, dA_cumsum = _chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, log2=False)
    return dt_out, dA_cumsum


def chunk_cumsum_log2(
    dt: torch.Tensor,
    A: torch.Tensor,
    chunk_size: int,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 1 for the backward: `chunk_cumsum`'s arguments and results, and dA_cumsum·log2(e) from the same
    launch, which bwd_dx takes with bf16 inputs (`kernels.cutile.ssd.ssd_backward` hands it on).

    Returns:
        dt_out, dA_cumsum: as `chunk_cumsum`.  dA_log2: (b, h, c, Q) float32, dA_cumsum·log2(e).
    """
    dt_out, dA_cumsum, dA_log2 = _chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, log2=True)
    return dt_out, dA_cumsum, dA_log2
