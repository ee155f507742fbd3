"""Backward stage 4 in cuTile: the decay and dt gradients back through stage 1 (chunk_cumsum), in one launch.

Reference: `kernels.reference_backward.chunk_cumsum_bwd`, whose contract the host function keeps. One program
per (batch, chunk, head tile) reads the (b, h, c * Q) rows the other backward stages wrote and forms, per
token,
    da = da_intra + da_inter,   ddt = (ddt_dir + A da) · softplus'(dt + dt_bias)   (the factor only with softplus)
and writes ddt in dt's dtype and (b, l, h) layout, transposing the rows in registers; tokens past the
sequence end are not written. Each program also writes its chunk's partial sums per head, Σ dt_out da (for
dA) and Σ ddt (for d dt_bias), and copies bwd_dx's partial sum of dD beside them: three rows per head with the
(batch, chunk) columns along them, which the host reduces in one torch.sum along contiguous rows into the
(3, h) per-head gradients. In PyTorch the same work was about ten elementwise kernels, two reductions and a
transposing copy (docs/kernels.md, chunk_cumsum_bwd).

softplus'(u) is sigmoid(u), computed from the raw dt as the forward's softplus saw it (identity above
SOFTPLUS_THRESHOLD, so there the factor is 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cuda.tile as ct
import torch

from kernels.cutile.chunk_cumsum import SOFTPLUS_THRESHOLD, dt_key, head_grid, head_params
from kernels.cutile.chunk_cumsum import search_space as cumsum_space
from kernels.cutile.launch import BACKWARD_CHUNK, ZERO, ConstBool, ConstInt, launch, with_hints
from kernels.cutile.signature import DTYPES, Specialization, array, hinted, kernel_signature, scalar


@ct.kernel
def chunk_cumsum_bwd_kernel(
    ddt_dir,  # (b, h, c * Q) float32
    da_intra,  # (b, h, c * Q) float32
    da_inter,  # (b, h, c * Q) float32
    dt_out,  # (b, h, c * Q) float32
    dt,  # (b, l, h) raw time steps, any float dtype (read only with SOFTPLUS)
    A,  # (h,) float32
    dt_bias,  # (h,) float32 (ignored unless HAS_BIAS)
    dD_part,  # (h, b * c) float32, bwd_dx's partial sums of dD (ignored unless HAS_D)
    ddt,  # (b, l, h) in dt's dtype, written
    partials,  # (3, h, b * c) float32, written at column (batch, chunk): the chunk's Σ dt_out·da, Σ ddt (zero
    # without HAS_BIAS) and dD_part's column (zero without HAS_D)
    seqlen: int,
    Q: ConstInt,
    TILE_H: ConstInt,
    HAS_BIAS: ConstBool,
    SOFTPLUS: ConstBool,
    HAS_D: ConstBool,
):
    bi = ct.bid(0)
    ci = ct.bid(1)
    hj = ct.bid(2)

    # the chunk's (TILE_H, Q) blocks of the (b, h, c * Q) rows
    row = (bi, hj, ci)
    da = ct.load(da_intra, index=row, shape=(1, TILE_H, Q), padding_mode=ZERO, latency=4).reshape((TILE_H, Q))
    da = da + ct.load(da_inter, index=row, shape=(1, TILE_H, Q), padding_mode=ZERO, latency=4).reshape((TILE_H, Q))
    grad = ct.load(ddt_dir, index=row, shape=(1, TILE_H, Q), padding_mode=ZERO, latency=4).reshape((TILE_H, Q))
    d = ct.load(dt_out, index=row, shape=(1, TILE_H, Q), padding_mode=ZERO, latency=4).reshape((TILE_H, Q))
    a = ct.load(A, index=(hj,), shape=(TILE_H,), padding_mode=ZERO).reshape((TILE_H, 1))
    grad = grad + a * da
    if SOFTPLUS:
        u = ct.load(dt, index=(bi, ci, hj), shape=(1, Q, TILE_H), padding_mode=ZERO, latency=4).reshape((Q, TILE_H))
        u = ct.transpose(u.astype(ct.float32))
        if HAS_BIAS:
            u = u + ct.load(dt_bias, index=(hj,), shape=(TILE_H,), padding_mode=ZERO).reshape((TILE_H, 1))
        grad = grad * ct.where(u > SOFTPLUS_THRESHOLD, 1.0, 1.0 / (1.0 + ct.exp(-u)))
    # Padding tokens had dt forced to 0 after the softplus: no gradient reaches dt or dt_bias through them.
    token = ci * Q + ct.arange(Q, dtype=ct.int32).reshape((1, Q))
    grad = ct.where(token < seqlen, grad, 0.0)
    ct.store(ddt, index=(bi, ci, hj), tile=ct.transpose(grad).astype(ddt.dtype).reshape((1, Q, TILE_H)))
    # padding tokens have dt_out = 0: they add nothing to dA
    column = bi * ct.num_blocks(1) + ci
    ct.store(partials, index=(0, hj, column), tile=ct.sum(d * da, axis=1).reshape((1, TILE_H, 1)))
    if HAS_BIAS:
        ct.store(partials, index=(1, hj, column), tile=ct.sum(grad, axis=1).reshape((1, TILE_H, 1)))
    else:
        ct.store(partials, index=(1, hj, column), tile=ct.zeros((1, TILE_H, 1), dtype=ct.float32))
    if HAS_D:
        part = ct.load(dD_part, index=(hj, column), shape=(TILE_H, 1), padding_mode=ZERO)
        ct.store(partials, index=(2, hj, column), tile=part.reshape((1, TILE_H, 1)))
    else:
        ct.store(partials, index=(2, hj, column), tile=ct.zeros((1, TILE_H, 1), dtype=ct.float32))


@dataclass(frozen=True)
class CumsumBwdConfig:
    """Heads handled by one program (a power of two) and the occupancy hint: without one the compiler gives the
    kernel all the registers a thread can take (sm_90, the launched specializations), two programs per SM; occupancy 4
    builds it without spilling."""

    TILE_H: int = 8
    occupancy: int = 4


def search_space(nheads: int) -> list[CumsumBwdConfig]:
    """Configurations worth timing for this number of heads."""
    return [CumsumBwdConfig(c.TILE_H, occ) for c in cumsum_space(nheads) for occ in (1, 2, 4)]


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, at the backward's chunk size with CumsumBwdConfig's tile and hint, in every
    dtype: with dt_bias, softplus and D, and with none of them."""
    f32 = ct.float32
    chunk, cfg = BACKWARD_CHUNK, CumsumBwdConfig()
    for name, dtype in DTYPES.items():
        for bias, softplus, has_d in ((True, True, True), (False, False, False)):
            label = f"chunk_cumsum_bwd[{name},bias={bias},softplus={softplus},D={has_d}]"
            yield (
                *hinted(label, chunk_cumsum_bwd_kernel, cfg.occupancy),
                kernel_signature(
                    [array(f32, 3)] * 4
                    + [array(dtype, 3), array(f32, 1), array(f32, 1), array(f32, 2), array(dtype, 3)]
                    + [array(f32, 3), scalar(), chunk, cfg.TILE_H, bias, softplus, has_d]
                ),
            )


def chunk_cumsum_bwd(
    ddt_dir: torch.Tensor,
    da_intra: torch.Tensor,
    da_inter: torch.Tensor,
    dt_out: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    dt_softplus: bool = False,
    dt_bias: torch.Tensor | None = None,
    dD_parts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward stage 4 on the GPU. Same contract as `kernels.reference_backward.chunk_cumsum_bwd`.

    Args:
        ddt_dir, da_intra, da_inter, dt_out: (b, h, c, Q) float32.  dt: (b, l, h) the forward's raw dt.
        A, dt_bias: (h,).  dD_parts: (h, b·c) float32 from `bwd_dx` (column batch·c + chunk), or None.
    Returns:
        ddt: (b, l, h) in dt's dtype, contiguous.  dheads: (3, h) float32, the rows dA, d dt_bias, dD (a row is
        zero when its input is None).
    """
    b, h, nchunks, chunk_size = dt_out.shape
    seqlen = dt.shape[1]
    rows = (b, h, nchunks * chunk_size)
    ddt = torch.empty(dt.shape, device=dt.device, dtype=dt.dtype)
    partials = torch.empty((3, h, b * nchunks), device=dt.device, dtype=torch.float32)
    A32, bias32 = head_params(A, dt_bias)
    if dD_parts is not None and dD_parts.shape != (h, b * nchunks):
        raise ValueError(f"chunk_cumsum_bwd: dD_parts has shape {tuple(dD_parts.shape)}, want {(h, b * nchunks)}")
    parts = A32.view(1, h) if dD_parts is None else dD_parts  # read only with dD_parts
    arrays = (ddt_dir.reshape(rows), da_intra.reshape(rows), da_inter.reshape(rows), dt_out.reshape(rows))

    def spec(cfg: CumsumBwdConfig) -> tuple[tuple[int, ...], object, tuple]:
        grid, th = head_grid(b, nchunks, h, cfg.TILE_H)
        args = (*arrays, dt, A32, bias32, parts, ddt, partials, seqlen, chunk_size, th, dt_bias is not None)
        args += (dt_softplus, dD_parts is not None)
        return grid, with_hints(chunk_cumsum_bwd_kernel, cfg.occupancy), args

    key = dt_key(dt, chunk_size)
    launch("chunk_cumsum_bwd", key, CumsumBwdConfig(), lambda: search_space(h), spec, dt.device)
    return ddt, partials.sum(2)
