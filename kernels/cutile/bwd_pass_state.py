"""Backward stage 1 in cuTile: the gradient of every chunk's state, walking the chunks backwards.

Reference: `kernels.reference_backward.bwd_pass_state`, whose contract the host function keeps. The
mirror of fwd_pass_state: one program per (batch, head, head-dim tile, state tile) starts from the
gradient arriving on the final state (or 0) and walks the chunks from the last: it stores Ĝ_k (the
gradient of the state leaving chunk k), then steps over the chunk with one ct.mma,
    G = exp(G_end) * G + (dy * exp(G))ᵀ C        (TILE_P, Q) @ (Q, TILE_N),
and stores G after chunk 0 as the gradient of the initial state.

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
from kernels.cutile.fwd_pass_state import StateConfig, search_space, states_array, states_dtype, walk_product
from kernels.cutile.launch import BACKWARD_CHUNK, ZERO, ConstBool, ConstInt, launch, shape_key, with_hints
from kernels.cutile.signature import DTYPES, Specialization, array, hinted, kernel_signature


@ct.function
def backward_walk(
    dy, C, dA_cumsum, dfinal_state, dstates, dinitial_states, bh, pj, nj, NHEADS, HEADS_PER_GROUP, Q, TILE_P, TILE_N,
    HAS_DFINAL, TF32, LATENCY,
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
        # C scaled by each token's decay from the chunk start; the product accumulates onto the decayed gradient
        # (formed from zero, as the forward's two-chunk walk does, it was slower at the seed: docs/kernels.md,
        # state_walks)
        grad = walk_product(dyk, ck.astype(ct.float32) * ct.exp2(g), grad * ct.exp2(g_end), TF32)
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
):
    backward_walk(
        dy, C, dA_cumsum, dfinal_state, dstates, dinitial_states, ct.bid(0), ct.bid(1), ct.bid(2), NHEADS,
        HEADS_PER_GROUP, Q, TILE_P, TILE_N, HAS_DFINAL, TF32, LATENCY,
    )  # fmt: skip


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, at the backward's chunk size with StateConfig()'s tile and occupancy: bf16
    with and without a final-state gradient, float32 (TF32 products) without."""
    f32 = ct.float32
    chunk = BACKWARD_CHUNK
    for name, dfinal in (("bfloat16", True), ("bfloat16", False), ("float32", False)):
        dtype, label = DTYPES[name], f"bwd_pass_state[{name},Q={chunk},dfinal={dfinal}]"
        yield (
            *hinted(label, bwd_pass_state_kernel, StateConfig().occupancy),
            kernel_signature(
                [array(dtype, 4), array(dtype, 4), array(f32, 3), array(f32, 4), states_array(name), array(f32, 4)]
                + [8, 8, chunk, 32, 64, dfinal, name == "float32", 4]
            ),
        )


def bwd_pass_state(
    dy: torch.Tensor,
    C: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dfinal_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward stage 1 on the GPU. Same contract as `kernels.reference_backward.bwd_pass_state`.

    Args:
        dy: (b, l, h, p).  C: (b, l, g, n).  dA_cumsum: (b, h, c, Q) float32.  dfinal_state: (b, h, p, n) or None.
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
        grid = (b * h, -(-p // cfg.TILE_P), -(-n // cfg.TILE_N))
        args = (*arrays, h, h // g, chunk_size, cfg.TILE_P, cfg.TILE_N)
        args += (dfinal_state is not None, dy.dtype == torch.float32, cfg.latency)
        return grid, with_hints(bwd_pass_state_kernel, cfg.occupancy), args

    key = shape_key(dy, C, chunk_size)
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
