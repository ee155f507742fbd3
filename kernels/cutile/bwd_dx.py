"""Backward stage 2 in cuTile: dx, dD's partial sums and the state-free parts of the decay gradient, per (chunk, head).

Reference: `kernels.reference_backward.bwd_dx`, whose contract the host function keeps. A program takes CHUNKS
consecutive chunks of one batch·head in turn, holding a whole chunk (Q tokens, all of p and n) in registers; its
token tiles are loaded with a latency hint. At occupancy 1 the sm_90 build double-buffers them, at occupancy 2 it
does not; eight chunks at occupancy 2 is the fastest measured at the seed shape, ahead of four chunks and of one
(docs/kernels.md, bwd_dx). Per chunk:
    CB  = C Bᵀ,  L[t, s] = exp(G_t − G_s) [s <= t] (masked before the exponential),  K = CB ∘ L
    dx̃  = Kᵀ dy + e ∘ (B Ĝᵀ)               e_s = exp(G_end − G_s), Ĝ the state gradient from bwd_pass_state
    dx  = dt ∘ dx̃ + D dy;   ddt_dir = rows of x ∘ dx̃;   r = dt ∘ rows of x ∘ (e ∘ B Ĝᵀ)
    R   = (dy xᵀ) ∘ L ∘ dt_s ∘ CB
    da_intra_j = Σ_{t>=j} Σ_{s<j} R[t, s] + Σ_{s<j} r_s        (stable: nothing summed is later subtracted)
With document boundaries (seq_idx, HAS_SEQ_IDX) L is also 0 between tokens of different documents (masked with the
causal mask, before the exponential), and e_s is 0 for tokens not in the chunk's last document (they add nothing to
the state leaving it): dx̃, R and r, and so da_intra, carry the masks from there.
Products of raw inputs run on the input dtype (TF32 for float32 inputs); K and Ĝ enter their products in bf16
when the inputs are bf16 (BF16_MMA, as mamba_ssm does: K rounded from fp32, dy as loaded; bwd_pass_state then
stores Ĝ in bf16, and it enters the product as loaded), TF32 otherwise; everything summed accumulates in fp32.
With bf16 inputs G arrives in log2 units (dA_cumsum·log2(e), written by the backward's chunk_cumsum launch, or
scaled by the host when the caller has no such copy) for exp2: scaling the loaded tile in the kernel was slower at
the training step's shape. Other dtypes scale it in the kernel: with fp32 inputs at head dim 64 the host-scaled
form hangs on the GPU (cuda-tile 1.7.0, H200, occupancy 1 and 2 with the compiler's warp count; the kernel has no
loop), the kernel-scaled one does not (docs/kernels.md, bwd_dx). dD's partial sums are laid
out one row per head with the (batch, chunk) columns along it, as chunk_cumsum_bwd's partial sums, which copies
them beside its own so that one torch.sum finishes all three per-head gradients.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cuda.tile as ct
import torch

from kernels.cutile.chunk_cumsum import LOG2E
from kernels.cutile.fwd_pass_state import documents, states_array
from kernels.cutile.launch import (
    BACKWARD_CHUNK,
    TF,
    ZERO,
    ConstBool,
    ConstInt,
    launch,
    next_pow2,
    seq_idx_args,
    shape_key,
    with_hints,
)
from kernels.cutile.signature import DTYPES, Specialization, array, hinted, kernel_signature, scalar, seq_idx_params


@ct.kernel
def bwd_dx_kernel(
    x,  # (b, l, h, p)
    dy,  # (b, l, h, p)
    B,  # (b, l, g, n)
    C,  # (b, l, g, n)
    dt_out,  # (b, h, c * Q) float32
    dA_cumsum,  # (b, h, c * Q) float32, in log2 units when G_LOG2
    dstates,  # (b, c, h, p, n) bfloat16 (bf16 inputs) or float32
    D,  # (h,) float32 (ignored unless HAS_D)
    dx,  # (b, l, h, p), written
    ddt_dir,  # (b, h, c * Q) float32, written
    da_intra,  # (b, h, c * Q) float32, written
    dD_part,  # (h, b * c) float32, written: Σ over the chunk of dy · x, at column (batch, chunk)
    NHEADS: ConstInt,
    HEADS_PER_GROUP: ConstInt,
    Q: ConstInt,
    TILE_P: ConstInt,
    TILE_N: ConstInt,
    HAS_D: ConstBool,
    TF32: ConstBool,
    BF16_MMA: ConstBool,
    G_LOG2: ConstBool,
    CHUNKS: ConstInt,  # chunks a program takes in turn
    last_chunk: int,
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX; last: launch.seq_idx_args)
    HAS_SEQ_IDX: ConstBool,
):
    bh = ct.bid(0)
    bi = bh // NHEADS
    hi = bh % NHEADS
    gi = hi // HEADS_PER_GROUP
    rows = ct.arange(Q, dtype=ct.int32).reshape((Q, 1))  # s
    cols = ct.arange(Q, dtype=ct.int32).reshape((1, Q))  # t
    for step in range(CHUNKS):
        # CHUNKS consecutive chunks a program; past the end it takes the last chunk again (same values stored)
        k = ct.minimum(ct.bid(1) * CHUNKS + step, last_chunk)
        xk = ct.load(x, index=(bi, k, hi, 0), shape=(1, Q, 1, TILE_P), padding_mode=ZERO, latency=4).reshape(
            (Q, TILE_P)
        )
        dyk = ct.load(dy, index=(bi, k, hi, 0), shape=(1, Q, 1, TILE_P), padding_mode=ZERO, latency=4).reshape(
            (Q, TILE_P)
        )
        bk = ct.load(B, index=(bi, k, gi, 0), shape=(1, Q, 1, TILE_N), padding_mode=ZERO, latency=4).reshape(
            (Q, TILE_N)
        )
        ck = ct.load(C, index=(bi, k, gi, 0), shape=(1, Q, 1, TILE_N), padding_mode=ZERO, latency=4).reshape(
            (Q, TILE_N)
        )
        g = ct.load(dA_cumsum, index=(bi, hi, k), shape=(1, 1, Q)).reshape((Q, 1))
        if not G_LOG2:
            g = g * LOG2E
        d = ct.load(dt_out, index=(bi, hi, k), shape=(1, 1, Q)).reshape((Q, 1))
        grad = ct.load(dstates, index=(bi, k, hi, 0, 0), shape=(1, 1, 1, TILE_P, TILE_N), padding_mode=ZERO).reshape(
            (TILE_P, TILE_N)
        )
        g_row = g.reshape((1, Q))
        g_end = ct.extract(g, index=(Q - 1, 0), shape=(1, 1))
        if TF32:
            x_mm, dy_mm, b_mm, c_mm = xk.astype(TF), dyk.astype(TF), bk.astype(TF), ck.astype(TF)
        else:
            x_mm, dy_mm, b_mm, c_mm = xk, dyk, bk, ck
        # Every chunk x chunk tile is indexed [s, t] (source token, target token), so no computed tile is
        # transposed: Kᵀ[s, t] = B_s · C_t exp(G_t − G_s) for t >= s (masked before the exponential).
        causal = cols >= rows
        doc = None  # the tokens' document ids, with seq_idx
        if HAS_SEQ_IDX:
            doc = documents(seq_idx, bi, k, Q).reshape((Q, 1))
            causal = causal & (doc == doc.reshape((1, Q)))  # and within one document
        kt = ct.mma(b_mm, ct.transpose(c_mm), ct.zeros((Q, Q), dtype=ct.float32))
        kt = kt * ct.exp2(ct.where(causal, g_row - g, -float("inf")))
        x32 = xk.astype(ct.float32)
        dy32 = dyk.astype(ct.float32)

        # The state term first: r is read off it before the intra-chunk term joins the accumulator.
        if BF16_MMA:  # astype is no operation on bf16 dstates: they enter the product as loaded
            dxt = ct.mma(bk, ct.transpose(grad.astype(ct.bfloat16)), ct.zeros((Q, TILE_P), dtype=ct.float32))
        else:
            dxt = ct.mma(bk.astype(TF), ct.transpose(grad.astype(TF)), ct.zeros((Q, TILE_P), dtype=ct.float32))
        to_end = ct.exp2(g_end - g)  # e_s
        if HAS_SEQ_IDX:  # only tokens of the chunk's last document reach the state leaving it
            to_end = ct.where(doc == ct.extract(doc, index=(Q - 1, 0), shape=(1, 1)), to_end, 0.0)
        dxt = dxt * to_end
        r = d * ct.sum(x32 * dxt, axis=1, keepdims=True)  # (Q, 1)
        if BF16_MMA:  # K rounded to bf16, dy bf16 as loaded
            dxt = ct.mma(kt.astype(ct.bfloat16), dyk, dxt)
        else:
            dxt = ct.mma(kt.astype(TF), dyk.astype(TF), dxt)
        out = d * dxt
        if HAS_D:
            out = out + ct.load(D, index=(hi,), shape=(1,)).reshape((1, 1)) * dy32
        ct.store(dx, index=(bi, k, hi, 0), tile=out.astype(dx.dtype).reshape((1, Q, 1, TILE_P)))
        ct.store(ddt_dir, index=(bi, hi, k), tile=ct.sum(x32 * dxt, axis=1).reshape((1, 1, Q)))
        ct.store(dD_part, index=(hi, bi * (last_chunk + 1) + k), tile=ct.sum(dy32 * x32, keepdims=True).reshape((1, 1)))

        # Rᵀ[s, t] = (x_s · dy_t) Kᵀ[s, t] dt_s;  term1_j = Σ_{t>=j} Σ_{s<j} Rᵀ[s, t]: an exclusive prefix
        # sum down the rows, then a masked sum along each row.
        pairs = ct.mma(x_mm, ct.transpose(dy_mm), ct.zeros((Q, Q), dtype=ct.float32)) * kt * d
        before = ct.cumsum(pairs, axis=0) - pairs  # [j, t] = Σ_{s<j} Rᵀ[s, t]
        term1 = ct.sum(ct.where(cols >= rows, before, 0.0), axis=1, keepdims=True)
        term2 = ct.cumsum(r, axis=0) - r
        ct.store(da_intra, index=(bi, hi, k), tile=(term1 + term2).reshape((1, 1, Q)))


@dataclass(frozen=True)
class DxConfig:
    """Hints of a bwd_dx launch (its program holds a whole chunk at a time): occupancy, worker warps (0: the
    compiler's choice) and the chunks a program takes in turn. The default is the fastest measured with bf16 inputs:
    eight chunks at occupancy 2, which tuning chose at the seed shape and both training-step layers, ahead of four
    (docs/kernels.md, bwd_dx); `default_dx_config` gives other dtypes occupancy 1, one chunk a program."""

    occupancy: int = 2
    worker_warps: int = 0
    chunks: int = 8


def default_dx_config(dtype: torch.dtype) -> DxConfig:
    """The configuration used untuned: DxConfig() with bf16 inputs, where it was measured; occupancy 1 and one chunk
    a program otherwise (not measured there)."""
    return DxConfig() if dtype == torch.bfloat16 else DxConfig(occupancy=1, chunks=1)


def dx_space(dtype: torch.dtype = torch.bfloat16) -> list[DxConfig]:
    """The configurations tuning times. Not occupancy 2 with float32 inputs: that has not been measured, and the
    fp32 kernel sits at the register limit at occupancy 2 (it spills with D at sm_90)."""
    occupancies = (1,) if dtype == torch.float32 else (1, 2)
    return [DxConfig(occ, 0, ch) for occ in occupancies for ch in (2, 4, 8)] + [DxConfig(occupancies[-1], 0, 1)]


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, at the backward's chunk size with each dtype's default hints and chunks a
    program: float32 (TF32 products) at head dim 64 and state 64 without D; bf16 at 64 and 128 with D, at 128 and 64
    without; then with seq_idx, float32 and bf16 at 64 and 128 with D. float16 is not among them: it takes bf16's
    code path with BF16_MMA off, the products with fp32-formed operands in TF32. float32's comes first, the one the
    default test run compiles: the bf16 default's loop over eight chunks is the slowest of all the kernels' builds to
    compile at sm_90."""
    f32 = ct.float32
    chunk = BACKWARD_CHUNK
    for name, tile_p, tile_n, has_d, has_seq_idx in (
        ("float32", 64, 64, False, False),
        ("bfloat16", 64, 128, True, False),
        ("bfloat16", 128, 64, False, False),
        ("float32", 64, 64, True, True),
        ("bfloat16", 64, 128, True, True),
    ):
        dtype, bf16 = DTYPES[name], name == "bfloat16"
        cfg = default_dx_config(getattr(torch, name))
        label = f"bwd_dx[{name},Q={chunk},P={tile_p},N={tile_n},D={has_d}" + (",seq_idx]" if has_seq_idx else "]")
        yield (
            *hinted(label, bwd_dx_kernel, cfg.occupancy, cfg.worker_warps),
            kernel_signature(
                [array(dtype, 4)] * 4
                + [array(f32, 3), array(f32, 3), states_array(name), array(f32, 1), array(dtype, 4)]
                + [array(f32, 3)] * 2
                + [array(f32, 2), 8, 4, chunk, tile_p, tile_n, has_d, name == "float32", bf16, bf16]
                + [cfg.chunks, scalar(), *seq_idx_params(has_seq_idx)]
            ),
        )


def bwd_dx(
    x: torch.Tensor,
    dy: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dstates: torch.Tensor,
    D: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dA_log2: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Backward stage 2 on the GPU. Same contract as `kernels.reference_backward.bwd_dx`, dx in x's dtype.

    Args:
        x, dy: (b, l, h, p).  B, C: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q) float32.
        dstates: (b, c, h, p, n) from `bwd_pass_state`: bfloat16 with bfloat16 inputs, float32 otherwise.
        D: (h,) or None.
        seq_idx: (b, l) int32 document ids, contiguous, non-decreasing along each row, or None.
        dA_log2: (b, h, c, Q) float32, dA_cumsum·log2(e) (`chunk_cumsum_log2`), read with bf16 inputs; None: the
            host scales dA_cumsum then (one elementwise launch more).
    Returns:
        dx: (b, l, h, p) in x's dtype.  ddt_dir, da_intra: (b, h, c, Q) float32.
        dD_parts: (h, b·c) float32 partial sums of dD, or None without D.
    """
    b, _, h, p = x.shape
    g, n = B.shape[-2:]
    _, _, nchunks, chunk_size = dt_out.shape
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    ddt_dir = torch.empty_like(dt_out)
    da_intra = torch.empty_like(dt_out)
    dD_part = torch.empty((h, b * nchunks), device=x.device, dtype=torch.float32)
    D32 = dt_out if D is None else D.to(torch.float32).contiguous()
    rows = (b, h, nchunks * chunk_size)
    g_log2 = x.dtype == torch.bfloat16  # G in log2 units (see the module docstring)
    if not g_log2:
        dA_g = dA_cumsum
    else:
        dA_g = dA_cumsum * LOG2E if dA_log2 is None else dA_log2
    outs = (dx, ddt_dir.view(rows), da_intra.view(rows), dD_part)
    ids = seq_idx_args(seq_idx, dt_out.view(rows), chunk_size)

    def spec(cfg: DxConfig) -> tuple[tuple[int, ...], object, tuple]:
        args = (x, dy, B, C, dt_out.view(rows), dA_g.view(rows), dstates, D32, *outs, h, h // g, chunk_size)
        args += (next_pow2(p), next_pow2(n), D is not None, x.dtype == torch.float32, x.dtype == torch.bfloat16, g_log2)
        args += (cfg.chunks, nchunks - 1, *ids)
        return (b * h, -(-nchunks // cfg.chunks)), with_hints(bwd_dx_kernel, cfg.occupancy, cfg.worker_warps), args

    key = shape_key(x, B, chunk_size, seq_idx)
    launch("bwd_dx", key, default_dx_config(x.dtype), lambda: dx_space(x.dtype), spec, x.device)
    return dx, ddt_dir, da_intra, None if D is None else dD_part
