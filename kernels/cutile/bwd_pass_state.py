"""Backward stage 1 in cuTile: the gradient of every chunk's state, walking the chunks backwards.

Reference: `kernels.reference_backward.bwd_pass_state`, whose contract the host function keeps. The
mirror of fwd_pass_state: one program per (batch, head, head-dim tile, state tile) starts from the
gradient arriving on the final state (or 0) and walks the chunks from the last: it stores Ĝ_k (the
gradient of the state leaving chunk k), then steps over the chunk with one ct.mma,
    G = exp(G_end) * G + (dy * exp(G))ᵀ C        (TILE_P, Q) @ (Q, TILE_N),
and stores G after chunk 0 as the gradient of the initial state.

With document boundaries (seq_idx, HAS_SEQ_IDX) it mirrors the forward's masks: the gradient arriving on the state
leaving the chunk passes back only where the chunk ends in the previous chunk's last document (else its factor is
0, the cut), and only tokens of that previous document read the state entering the chunk, so only their dy
reaches its gradient (exp(G) is 0 on the others).

With bf16 inputs (dy) dstates is stored in bf16, as mamba_ssm's state-passing backward stores it in the
inputs' dtype: it halves the largest tensor this stage writes and bwd_dx and bwd_dbc read. The recurrence
stays fp32 in registers (only the stored copy is rounded) and dinitial_states stays float32; fp32 and fp16
inputs keep float32 dstates. bwd_dx's and bwd_dbc's bf16 products rounded the gradient to bf16 already, so
only bwd_dbc's fp32 term exp(G_end) <Ĝ, S> sees the rounding.
"""

from __future__ import annotations

from collections.abc import Iterator

import cuda.tile as ct
import torch

from kernels.cutile.chunk_cumsum import LOG2E
from kernels.cutile.fwd_pass_state import (
    StateConfig,
    document_before,
    documents,
    search_space,
    state_grid,
    states_array,
    states_dtype,
    walk_product,
)
from kernels.cutile.launch import (
    BACKWARD_CHUNK,
    ZERO,
    ConstBool,
    ConstInt,
    launch,
    seq_idx_args,
    shape_key,
    with_hints,
)
from kernels.cutile.signature import DTYPES, Specialization, array, hinted, kernel_signature, seq_idx_params


@ct.function
def backward_walk(
    dy, C, dA_cumsum, dfinal_state, dstates, dinitial_states, bh, pj, nj, NHEADS, HEADS_PER_GROUP, Q, TILE_P, TILE_N,
    HAS_DFINAL, TF32, LATENCY, seq_idx, HAS_SEQ_IDX,
):  # fmt: skip
    """The walk of program (bh: batch·head, pj: head-dim tile, nj: state tile) back over every chunk, the kernel's
    arguments as bwd_pass_state_kernel takes them. A device function: bwd_pass_state_kernel's body, and the
    backward half of kernels.cutile.state_walks' launch."""
    bi = bh // NHEADS
    hi = bh % NHEADS
    gi = hi // HEADS_PER_GROUP
    if HAS_DFINAL:
        grad = ct.load(dfinal_state, index=(bi, hi, pj, nj), shape=(1, 1, TILE_P, TILE_N), padding_mode=ZERO).reshape(
            (TILE_P, TILE_N)
        )
    else:
        grad = ct.zeros((TILE_P, TILE_N), dtype=ct.float32)
    nchunks = dstates.shape[1]
    for step in range(nchunks):
        k = nchunks - 1 - step
        # the stored copy is rounded to dstates' dtype; the gradient carried on stays fp32
        ct.store(dstates, index=(bi, k, hi, pj, nj), tile=grad.astype(dstates.dtype).reshape((1, 1, 1, TILE_P, TILE_N)))
        g = ct.load(dA_cumsum, index=(bi, hi, k), shape=(1, 1, Q), latency=2).reshape((Q, 1)) * LOG2E
        dyk = ct.load(dy, index=(bi, k, hi, pj), shape=(1, Q, 1, TILE_P), padding_mode=ZERO, latency=LATENCY).reshape(
            (Q, TILE_P)
        )
        ck = ct.load(C, index=(bi, k, gi, nj), shape=(1, Q, 1, TILE_N), padding_mode=ZERO, latency=LATENCY).reshape(
            (Q, TILE_N)
        )
        g_end = ct.extract(g, index=(Q - 1, 0), shape=(1, 1))
        from_start = ct.exp2(g)  # each token's decay from the chunk start
        decay = ct.exp2(g_end)
        if HAS_SEQ_IDX:
            doc = documents(seq_idx, bi, k, Q).reshape((Q, 1))
            before = document_before(seq_idx, bi, k, Q)
            from_start = ct.where(doc == before, from_start, 0.0)
            decay = ct.where(ct.extract(doc, index=(Q - 1, 0), shape=(1, 1)) == before, decay, 0.0)
        # C scaled by each token's decay from the chunk start; the product accumulates onto the decayed gradient
        # (formed from zero, as the forward's two-chunk walk does, it was slower at the seed: docs/kernels.md,
        # state_walks)
        grad = walk_product(dyk, ck.astype(ct.float32) * from_start, grad * decay, TF32)
    ct.store(dinitial_states, index=(bi, hi, pj, nj), tile=grad.reshape((1, 1, TILE_P, TILE_N)))


@ct.kernel
def bwd_pass_state_kernel(
    dy,  # (b, l, h, p)
    C,  # (b, l, g, n)
    dA_cumsum,  # (b, h, c * Q) float32
    dfinal_state,  # (b, h, p, n) float32 (ignored unless HAS_DFINAL)
    dstates,  # (b, c, h, p, n) bfloat16 (bf16 inputs) or float32, written
    dinitial_states,  # (b, h, p, n) float32, written
    NHEADS: ConstInt,
    HEADS_PER_GROUP: ConstInt,
    Q: ConstInt,
    TILE_P: ConstInt,
    TILE_N: ConstInt,
    HAS_DFINAL: ConstBool,
    TF32: ConstBool,
    LATENCY: ConstInt,
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX; last: launch.seq_idx_args)
    HAS_SEQ_IDX: ConstBool,
):
    backward_walk(
        dy, C, dA_cumsum, dfinal_state, dstates, dinitial_states, ct.bid(0), ct.bid(1), ct.bid(2), NHEADS,
        HEADS_PER_GROUP, Q, TILE_P, TILE_N, HAS_DFINAL, TF32, LATENCY, seq_idx, HAS_SEQ_IDX,
    )  # fmt: skip


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, at the backward's chunk size with StateConfig()'s tile and occupancy: bf16
    with and without a final-state gradient, float32 (TF32 products) without; then with seq_idx, bf16 with a
    final-state gradient and float32 without."""
    cases = [("bfloat16", True, False), ("bfloat16", False, False), ("float32", False, False)]
    cases += [("bfloat16", True, True), ("float32", False, True)]
    for name, dfinal, has_seq_idx in cases:
        label = f"bwd_pass_state[{name},Q={BACKWARD_CHUNK},dfinal={dfinal}" + (",seq_idx]" if has_seq_idx else "]")
        yield (
            *hinted(label, bwd_pass_state_kernel, StateConfig().occupancy),
            kernel_signature(
                walk_signature(name)
                + [8, 8, BACKWARD_CHUNK, 32, 64, dfinal, name == "float32", 4, *seq_idx_params(has_seq_idx)]
            ),
        )


def walk_signature(name: str) -> list:
    """The backward walk's six array arguments (`walk_arrays`) with inputs of dtype `name`."""
    dtype, f32 = DTYPES[name], ct.float32
    return [array(dtype, 4), array(dtype, 4), array(f32, 3), array(f32, 4), states_array(name), array(f32, 4)]


def bwd_pass_state(
    dy: torch.Tensor,
    C: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dfinal_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward stage 1 on the GPU. Same contract as `kernels.reference_backward.bwd_pass_state`.

    Args:
        dy: (b, l, h, p).  C: (b, l, g, n).  dA_cumsum: (b, h, c, Q) float32.  dfinal_state: (b, h, p, n) or None.
        seq_idx: (b, l) int32 document ids, contiguous, non-decreasing along each row, or None.
    Returns:
        dstates: (b, c, h, p, n), the gradient of the state leaving each chunk: bfloat16 when dy is bfloat16, else
            float32.
        dinitial_states: (b, h, p, n) float32.
    """
    b, _, h, p = dy.shape
    g, n = C.shape[-2:]
    chunk_size = dA_cumsum.shape[-1]
    arrays = walk_arrays(dy, C, dA_cumsum, dfinal_state)

    def spec(cfg: StateConfig) -> tuple[tuple[int, ...], object, tuple]:
        grid = state_grid(b * h, p, n, cfg)
        args = (*arrays, h, h // g, chunk_size, cfg.TILE_P, cfg.TILE_N, dfinal_state is not None)
        args += (dy.dtype == torch.float32, cfg.latency, *seq_idx_args(seq_idx, arrays[2], chunk_size))
        return grid, with_hints(bwd_pass_state_kernel, cfg.occupancy), args

    key = shape_key(dy, C, chunk_size, seq_idx)
    launch("bwd_pass_state", key, StateConfig(), lambda: search_space(p, n), spec, dy.device)
    return arrays[4], arrays[5]


def walk_arrays(
    dy: torch.Tensor, C: torch.Tensor, dA_cumsum: torch.Tensor, dfinal_state: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """The backward walk's six array arguments, as backward_walk takes them: dy, C, dA_cumsum (as rows), the final
    state's gradient (float32; dinitial_states stands in when there is none), and its outputs, dstates (b, c, h, p,
    n) in states_dtype(dy.dtype) and dinitial_states (b, h, p, n) float32, allocated."""
    b, _, h, p = dy.shape
    n = C.shape[-1]
    _, _, nchunks, chunk_size = dA_cumsum.shape
    dstates = torch.empty((b, nchunks, h, p, n), device=dy.device, dtype=states_dtype(dy.dtype))
    dinit = torch.empty((b, h, p, n), device=dy.device, dtype=torch.float32)
    dfinal = dinit if dfinal_state is None else dfinal_state.to(torch.float32).contiguous()
    return dy, C, dA_cumsum.view(b, h, nchunks * chunk_size), dfinal, dstates, dinit
