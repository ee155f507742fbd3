"""Backward stage 3 in cuTile: dB, dC and the decay-gradient terms that need the chunk state, per (chunk, group).

Reference: `kernels.reference_backward.bwd_dbc`, whose contract the host function keeps. One program per
(batch·group, chunk, block of TILE_N state columns) loops over the heads of its group, accumulating in
fp32 registers
    dCB_Σ += (dy xᵀ) ∘ L ∘ dt_s                    the intra-chunk score gradient, summed over the heads
    dC    += exp(G) ∘ (dy S)                       S the state entering the chunk (fwd_pass_state)
    dB    += (exp(G_end − G) dt) ∘ (x Ĝ)            Ĝ the gradient of the state leaving it (bwd_pass_state)
and per head stores da_inter_j = Σ_{t>=j} q_t + exp(G_end) <Ĝ, S>, q_t = C_t · (exp(G_t) S dy_t).
After the heads: dC += dCB_Σ B and dB += dCB_Σᵀ C, two more products (C·Bᵀ is shared by the group).
With document boundaries (seq_idx, HAS_SEQ_IDX) the forward's masks: L is 0 between tokens of different documents,
exp(G) (dC's inter term, q) is 0 on tokens not in the previous chunk's last document, exp(G_end − G) (dB's state
term) on tokens not in the chunk's last document, and exp(G_end) <Ĝ, S> is 0 where the chunk does not end in the
previous chunk's last document (the state entering it is cut). dC's mask holds for every head of a token, so it is
applied once, to the sum over the heads; dB's comes in dt_last, dt zeroed on the tokens not in the chunk's last
document (last_document_dt, on the host): every mask of db_acc built in the kernel that was tried spilled at 128
state columns, the loaded one does not (docs/kernels.md, "Document boundaries").
Splitting the state columns over programs shrinks each program's accumulators and state tiles; dCB_Σ is
then recomputed per block (it needs no state), and da_inter, a sum over the state columns, is written
per block and summed on the host. With bf16 inputs (BF16_MMA, as mamba_ssm does) the two per-head products
take S and Ĝ in bf16, and the two after the heads dCB_Σ in bf16 with B and C as loaded; TF32 otherwise; <Ĝ, S>
and every accumulator stay fp32.
S and Ĝ arrive in bf16 with bf16 inputs (fwd_pass_state and bwd_pass_state store them so), in float32
otherwise. The bf16 products take bf16 tiles as loaded (astype to a tile's own dtype is no operation); <Ĝ, S>
widens both tiles to fp32 before the product and the sum (bf16 tiles would multiply and reduce in bf16), so it
sees only the storage rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cuda.tile as ct
import torch

from kernels import reference
from kernels.cutile.fwd_pass_state import document_before, documents, states_array, within
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
def bwd_dbc_kernel(
    x,  # (b, l, h, p)
    dy,  # (b, l, h, p)
    B,  # (b, l, g, n)
    C,  # (b, l, g, n)
    dt_out,  # (b, h, c * Q) float32
    dA_cumsum,  # (b, h, c * Q) float32
    chunk_states,  # (b, c, h, p, n) bfloat16 or float32
    dstates,  # (b, c, h, p, n) bfloat16 or float32
    dB,  # (b, l, g, n), written
    dC,  # (b, l, g, n), written
    da_inter,  # (blocks, b, h, c * Q) float32, written: one row per block of state columns
    heads_per_group: int,  # a run-time bound: the head loop stays a loop
    NGROUPS: ConstInt,
    Q: ConstInt,
    TILE_P: ConstInt,
    TILE_N: ConstInt,
    TF32: ConstBool,
    BF16_MMA: ConstBool,
    dt_last,  # (b, h, c * Q) float32: dt on the tokens of each chunk's last document, 0 elsewhere (unless HAS_SEQ_IDX)
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX; last: launch.seq_idx_args)
    HAS_SEQ_IDX: ConstBool,
):
    bg = ct.bid(0)
    bi = bg // NGROUPS
    gi = bg % NGROUPS
    k = ct.bid(1)
    ni = ct.bid(2)
    bk = ct.load(B, index=(bi, k, gi, ni), shape=(1, Q, 1, TILE_N), padding_mode=ZERO).reshape((Q, TILE_N))
    ck = ct.load(C, index=(bi, k, gi, ni), shape=(1, Q, 1, TILE_N), padding_mode=ZERO).reshape((Q, TILE_N))
    c32 = ck.astype(ct.float32)
    causal = ct.arange(Q, dtype=ct.int32).reshape((Q, 1)) >= ct.arange(Q, dtype=ct.int32).reshape((1, Q))
    from_prev, carried = None, None  # with seq_idx, where a term counts: (Q, 1), (1, 1)
    if HAS_SEQ_IDX:
        doc = documents(seq_idx, bi, k, Q).reshape((Q, 1))
        before = document_before(seq_idx, bi, k, Q)
        last = ct.extract(doc, index=(Q - 1, 0), shape=(1, 1))
        causal = causal & (doc == doc.reshape((1, Q)))  # and within one document
        from_prev, carried = doc == before, last == before
    dcb = ct.zeros((Q, Q), dtype=ct.float32)
    dc_acc = ct.zeros((Q, TILE_N), dtype=ct.float32)
    db_acc = ct.zeros((Q, TILE_N), dtype=ct.float32)
    for j in range(heads_per_group):
        hi = gi * heads_per_group + j
        xk = ct.load(x, index=(bi, k, hi, 0), shape=(1, Q, 1, TILE_P), padding_mode=ZERO).reshape((Q, TILE_P))
        dyk = ct.load(dy, index=(bi, k, hi, 0), shape=(1, Q, 1, TILE_P), padding_mode=ZERO).reshape((Q, TILE_P))
        # natural-log units with ct.exp: scaling the loaded g by log2(e) for exp2 made this loop slower
        # (docs/kernels.md, bwd_dbc)
        g = ct.load(dA_cumsum, index=(bi, hi, k), shape=(1, 1, Q)).reshape((Q, 1))
        if Q < 64:  # tileiras 13.4 fails to schedule chunks of 16 and 32 when g is the load itself
            g = g + 0.0
        d = ct.load(dt_out, index=(bi, hi, k), shape=(1, 1, Q)).reshape((Q, 1))
        state = ct.load(
            chunk_states, index=(bi, k, hi, 0, ni), shape=(1, 1, 1, TILE_P, TILE_N), padding_mode=ZERO
        ).reshape((TILE_P, TILE_N))
        grad = ct.load(dstates, index=(bi, k, hi, 0, ni), shape=(1, 1, 1, TILE_P, TILE_N), padding_mode=ZERO).reshape(
            (TILE_P, TILE_N)
        )
        g_end = ct.extract(g, index=(Q - 1, 0), shape=(1, 1))
        decay = ct.exp(ct.where(causal, g - g.reshape((1, Q)), -float("inf")))
        if TF32:
            scores = ct.mma(dyk.astype(TF), ct.transpose(xk.astype(TF)), ct.zeros((Q, Q), dtype=ct.float32))
        else:
            scores = ct.mma(dyk, ct.transpose(xk), ct.zeros((Q, Q), dtype=ct.float32))
        dcb = dcb + scores * decay * d.reshape((1, Q))
        # (1, 1), fp32: the tiles widened first (no operation on float32 states)
        passed = ct.sum(grad.astype(ct.float32) * state.astype(ct.float32), keepdims=True)
        passing = within(ct.exp(g_end), carried, HAS_SEQ_IDX) * passed
        if BF16_MMA:
            inter = ct.mma(dyk, state.astype(ct.bfloat16), ct.zeros((Q, TILE_N), dtype=ct.float32))
        else:
            inter = ct.mma(dyk.astype(TF), state.astype(TF), ct.zeros((Q, TILE_N), dtype=ct.float32))
        inter = inter * ct.exp(g)
        dc_acc = dc_acc + inter
        q = within(ct.sum(c32 * inter, axis=1, keepdims=True), from_prev, HAS_SEQ_IDX)  # (Q, 1)
        if BF16_MMA:
            into_state = ct.mma(xk, grad.astype(ct.bfloat16), ct.zeros((Q, TILE_N), dtype=ct.float32))
        else:
            into_state = ct.mma(xk.astype(TF), grad.astype(TF), ct.zeros((Q, TILE_N), dtype=ct.float32))
        d_last = d
        if HAS_SEQ_IDX:
            d_last = ct.load(dt_last, index=(bi, hi, k), shape=(1, 1, Q)).reshape((Q, 1))
        db_acc = db_acc + into_state * (ct.exp(g_end - g) * d_last)
        da = ct.cumsum(q, axis=0, reverse=True) + passing
        ct.store(da_inter, index=(ni, bi, hi, k), tile=da.reshape((1, 1, 1, Q)))
    dc_acc = within(dc_acc, from_prev, HAS_SEQ_IDX)
    if BF16_MMA:  # dCB_Σ rounded to bf16, B and C bf16 as loaded
        dcb_bf = dcb.astype(ct.bfloat16)
        dc_acc = ct.mma(dcb_bf, bk, dc_acc)
        db_acc = ct.mma(ct.transpose(dcb_bf), ck, db_acc)
    else:
        dcb_tf = dcb.astype(TF)
        dc_acc = ct.mma(dcb_tf, bk.astype(TF), dc_acc)
        db_acc = ct.mma(ct.transpose(dcb_tf), ck.astype(TF), db_acc)
    ct.store(dC, index=(bi, k, gi, ni), tile=dc_acc.astype(dC.dtype).reshape((1, Q, 1, TILE_N)))
    ct.store(dB, index=(bi, k, gi, ni), tile=db_acc.astype(dB.dtype).reshape((1, Q, 1, TILE_N)))


@dataclass(frozen=True)
class DbcConfig:
    """State columns per program (0: all of them), the occupancy hint and worker warps (0: the compiler's
    choice). The default is the fastest measured at the seed shape (docs/kernels.md, bwd_dbc)."""

    TILE_N: int = 0
    occupancy: int = 1
    worker_warps: int = 0


def dbc_space() -> list[DbcConfig]:
    return [DbcConfig(tile_n, occ, warps) for tile_n in (0, 64) for occ in (1, 2) for warps in (0, 8)]


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, all state columns in one program (DbcConfig's default) with its hints: at
    the backward's chunk size bf16 at head dim 64 and state 128, at head dim 128 and state 64, float32 at 64 and 64;
    and at the chunks of 16 and 32 that smaller forward chunks give (where tileiras 13.4 failed to schedule one
    form of the kernel); then with seq_idx, bf16 at 64 and 128 and float32 at 64 and 64, at the backward's chunk
    size, and float32 at chunk 16."""
    f32 = ct.float32
    chunk = BACKWARD_CHUNK
    cases = [("bfloat16", chunk, 64, 128), ("bfloat16", chunk, 128, 64), ("float32", chunk, 64, 64)]
    cases += [("float32", 16, 64, 64), ("bfloat16", 32, 64, 64)]
    cases = [(*case, False) for case in cases]
    cases += [("bfloat16", chunk, 64, 128, True), ("float32", chunk, 64, 64, True), ("float32", 16, 64, 64, True)]
    cfg = DbcConfig()
    for name, q, tile_p, tile_n, has_seq_idx in cases:
        dtype, states = DTYPES[name], states_array(name)
        label = f"bwd_dbc[{name},Q={q},P={tile_p},N={tile_n}" + (",seq_idx]" if has_seq_idx else "]")
        yield (
            *hinted(label, bwd_dbc_kernel, cfg.occupancy, cfg.worker_warps),
            kernel_signature(
                [array(dtype, 4)] * 4
                + [array(f32, 3), array(f32, 3), states, states, array(dtype, 4), array(dtype, 4), array(f32, 4)]
                + [scalar(), 2, q, tile_p, tile_n, name == "float32", name == "bfloat16", array(f32, 3)]
                + seq_idx_params(has_seq_idx)
            ),
        )


def last_document_dt(dt_out: torch.Tensor, seq_idx: torch.Tensor) -> torch.Tensor:
    """dt on the tokens of each chunk's last document and 0 elsewhere: the weight of dB's state term.

    Args:
        dt_out: (b, h, c, Q) float32.  seq_idx: (b, l) int32, l <= c·Q (padded positions take the last token's id).
    Returns:
        (b, h, c, Q) float32.
    """
    b, _, c, Q = dt_out.shape
    tokens = reference.pad_seq_idx(seq_idx, Q).view(b, 1, c, Q)  # not chunk_seq_idx: its prev would be one more kernel
    return dt_out * (tokens == tokens[..., -1:])


def bwd_dbc(
    x: torch.Tensor,
    dy: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    chunk_states: torch.Tensor,
    dstates: torch.Tensor,
    seq_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward stage 3 on the GPU. Same contract as `kernels.reference_backward.bwd_dbc`, dB and dC in B's dtype.

    Args:
        x, dy: (b, l, h, p).  B, C: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q) float32.
        chunk_states, dstates: (b, c, h, p, n) from `fwd_pass_state` and `bwd_pass_state`, each bfloat16 with
            bfloat16 inputs, float32 otherwise.
        seq_idx: (b, l) int32 document ids, contiguous, non-decreasing along each row, or None.
    Returns:
        dB, dC: (b, l, g, n) in B's dtype.  da_inter: (b, h, c, Q) float32.
    """
    b, _, h, p = x.shape
    g, n = B.shape[-2:]
    _, _, nchunks, chunk_size = dt_out.shape
    dB = torch.empty_like(B, memory_format=torch.contiguous_format)
    dC = torch.empty_like(C, memory_format=torch.contiguous_format)
    rows = (b, h, nchunks * chunk_size)
    ids = seq_idx_args(seq_idx, dt_out.view(rows), chunk_size)
    dt_last = dt_out if seq_idx is None else last_document_dt(dt_out, seq_idx)  # read only with seq_idx
    da_inter_blocks: dict[DbcConfig, torch.Tensor] = {}  # (blocks, b, h, c * Q) per configuration launched

    def spec(cfg: DbcConfig) -> tuple[tuple[int, ...], object, tuple]:
        tile_n = min(cfg.TILE_N or next_pow2(n), next_pow2(n))
        blocks = -(-n // tile_n)
        if cfg not in da_inter_blocks:
            da_inter_blocks[cfg] = dt_out.new_empty((blocks,) + rows)
        out = da_inter_blocks[cfg]
        args = (x, dy, B, C, dt_out.view(rows), dA_cumsum.view(rows), chunk_states, dstates, dB, dC, out)
        args += (h // g, g, chunk_size, next_pow2(p), tile_n, x.dtype == torch.float32, x.dtype == torch.bfloat16)
        args += (dt_last.view(rows), *ids)
        return (b * g, nchunks, blocks), with_hints(bwd_dbc_kernel, cfg.occupancy, cfg.worker_warps), args

    cfg = launch("bwd_dbc", shape_key(x, B, chunk_size, seq_idx), DbcConfig(), dbc_space, spec, x.device)
    out = da_inter_blocks[cfg]
    da_inter = out.sum(0) if out.shape[0] > 1 else out[0]
    return dB, dC, da_inter.view_as(dt_out)
