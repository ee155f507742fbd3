"""Stage 3 of the SSD forward in cuTile: every token's output.

Reference: `kernels.reference.compute_out`, whose contract the host function `compute_out` keeps (y is
returned in x's dtype). One program per (batch·head, BLOCKS consecutive blocks
of TILE_T tokens taken in turn, head-dim tile). For its rows t it accumulates, in registers,
    acc  = exp(G_t) * (C_t · S_chunkᵀ)                                    carried state
    acc += sum over column blocks s <= t of  (C_t B_sᵀ ∘ exp(G_t - G_s) ∘ [t >= s] ∘ dt_s) x_s
    y    = acc + D x_t
The TILE_T × TILE_T interaction tile never leaves registers; the causal mask comes from comparing
token indices, applied before the exponential so nothing above the diagonal can overflow. The two products
with an fp32-formed operand (the chunk state, the score tile) take it in bf16 when the inputs are bf16 (as
mamba_ssm does; BF16_MMA: twice TF32's rate and half its registers), in TF32 otherwise; every product
accumulates in fp32, and y is stored in the input dtype. With bf16 inputs the chunk state arrives in bf16
(fwd_pass_state stores it so) and enters its product as loaded; with other inputs it arrives in float32.
With TILE_T = Q a program holds the whole chunk (the seed's layout); smaller TILE_T bounds the
registers for Q = 256 and skips the blocks above the diagonal.
With bf16 inputs D x_t joins the last product: D sits on the diagonal of the diagonal block's scores (whose x_s is
x_t), rounded to bf16 with them, so x_t is loaded once: faster, for a slightly larger error (docs/kernels.md,
compute_out). Other inputs add D x_t in float32 (in TF32 their error would grow tenfold).
With document boundaries (seq_idx, HAS_SEQ_IDX) a pair (t, s) counts only inside one document (masked with the
causal mask, before the exponential), and the carried state reaches row t only if t belongs to the previous chunk's
last document (exp(G_t) is 0 on the others).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cuda.tile as ct
import torch

from kernels.cutile.chunk_cumsum import LOG2E
from kernels.cutile.fwd_pass_state import states_array
from kernels.cutile.launch import ZERO, ConstBool, ConstInt, launch, next_pow2, seq_idx_args, shape_key, with_hints
from kernels.cutile.signature import DTYPES, Specialization, array, hinted, kernel_signature, scalar, seq_idx_params


@ct.function
def documents(seq_idx, bi, tile, T):
    """Row bi's document ids of tokens tile·T … tile·T + T − 1, (1, T) int32, gathered from seq_idx (b, l′), l′ a
    multiple of T (launch.seq_idx_args pads). Here a gather: the walks' tile load
    (kernels.cutile.fwd_pass_state.documents) made this kernel slower, its loops taking one or two tiles
    (docs/kernels.md, boundaries). A device function, inlined."""
    return ct.gather(seq_idx, (bi, tile * T + ct.arange(T, dtype=ct.int32))).reshape((1, T))


@ct.function
def document_before(seq_idx, bi, tile, T):
    """Row bi's document id of the token before tile `tile` of T tokens, (1, 1) int32, gathered: 0 for tile 0 (the
    gather pads index −1 with 0; the initial state belongs to document 0). A device function, inlined."""
    return ct.gather(seq_idx, (bi, tile * T - 1 + ct.zeros((1,), dtype=ct.int32))).reshape((1, 1))


@ct.function
def token_rows(t, bi, block, col, j, TILE_T, WIDTH, LATENCY):
    """The (TILE_T, WIDTH) tile of t (b, l, heads or groups, width) at token block `block`, head or group `col`,
    width tile j; rows past the sequence's end are zeros. A device function: inlined into the kernel."""
    tile = ct.load(t, index=(bi, block, col, j), shape=(1, TILE_T, 1, WIDTH), padding_mode=ZERO, latency=LATENCY)
    return tile.reshape((TILE_T, WIDTH))


@ct.kernel
def compute_out_kernel(
    x,  # (b, l, h, p)
    B,  # (b, l, g, n)
    C,  # (b, l, g, n)
    dt_out,  # (b, h, c * Q) float32
    dA_cumsum,  # (b, h, c * Q) float32
    chunk_states,  # (b, c, h, p, n) bfloat16 (bf16 inputs) or float32
    D,  # (h,) float32 (ignored unless HAS_D)
    y,  # (b, l, h, p), written
    NHEADS: ConstInt,
    HEADS_PER_GROUP: ConstInt,
    Q: ConstInt,
    TILE_T: ConstInt,
    TILE_P: ConstInt,
    TILE_N: ConstInt,
    HAS_D: ConstBool,
    TF32_CB: ConstBool,
    LATENCY: ConstInt,
    BF16_MMA: ConstBool,
    BLOCKS: ConstInt,  # token blocks a program takes in turn
    nblocks: int,  # token blocks of the sequence
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX; last: launch.seq_idx_args)
    HAS_SEQ_IDX: ConstBool,
):
    bh = ct.bid(0)
    bi = bh // NHEADS
    hi = bh % NHEADS
    gi = hi // HEADS_PER_GROUP
    pj = ct.bid(2)
    blocks_per_chunk = Q // TILE_T
    for step in range(BLOCKS):
        # Block of TILE_T tokens along the whole sequence. A last program past the end takes the last block
        # again (it stores the same values): a branch here costs more than the repeated block.
        tb = ct.minimum(ct.bid(1) * BLOCKS + step, nblocks - 1)
        k = tb // blocks_per_chunk  # chunk
        first = k * blocks_per_chunk  # first token block of the chunk

        g_t = ct.load(dA_cumsum, index=(bi, hi, tb), shape=(1, 1, TILE_T), latency=2).reshape((TILE_T, 1)) * LOG2E
        c_t = token_rows(C, bi, tb, gi, 0, TILE_T, TILE_N, LATENCY)
        c_tf = c_t.astype(ct.tfloat32)

        # Carried state: exp(G_t) * C_t · Sᵀ, S the state entering chunk k.
        s = ct.load(
            chunk_states, index=(bi, k, hi, pj, 0), shape=(1, 1, 1, TILE_P, TILE_N), padding_mode=ZERO, latency=2
        ).reshape((TILE_P, TILE_N))
        if BF16_MMA:  # astype is no operation on bf16 states: they enter the product as loaded
            acc = ct.mma(c_t, ct.transpose(s.astype(ct.bfloat16)), ct.zeros((TILE_T, TILE_P), dtype=ct.float32))
        else:
            acc = ct.mma(c_tf, ct.transpose(s.astype(ct.tfloat32)), ct.zeros((TILE_T, TILE_P), dtype=ct.float32))
        from_start = ct.exp2(g_t)
        doc_t = None  # the rows' document ids, with seq_idx
        if HAS_SEQ_IDX:
            doc_t = documents(seq_idx, bi, tb, TILE_T).reshape((TILE_T, 1))
            before = document_before(seq_idx, bi, k, Q)
            from_start = ct.where(doc_t == before, from_start, 0.0)
        acc = acc * from_start

        if TF32_CB:
            c_mm = c_tf
        else:
            c_mm = c_t
        if HAS_D:
            d_skip = ct.load(D, index=(hi,), shape=(1,)).reshape((1, 1))
        else:
            d_skip = ct.zeros((1, 1), dtype=ct.float32)
        t_idx = tb * TILE_T + ct.arange(TILE_T, dtype=ct.int32).reshape((TILE_T, 1))
        for sb in range(first, tb + 1):
            b_s = token_rows(B, bi, sb, gi, 0, TILE_T, TILE_N, LATENCY)
            x_s = token_rows(x, bi, sb, hi, pj, TILE_T, TILE_P, LATENCY)
            g_s = ct.load(dA_cumsum, index=(bi, hi, sb), shape=(1, 1, TILE_T), latency=2).reshape((1, TILE_T)) * LOG2E
            d_s = ct.load(dt_out, index=(bi, hi, sb), shape=(1, 1, TILE_T), latency=2).reshape((1, TILE_T))
            if TF32_CB:
                b_mm = b_s.astype(ct.tfloat32)
            else:
                b_mm = b_s
            cb = ct.mma(c_mm, ct.transpose(b_mm), ct.zeros((TILE_T, TILE_T), dtype=ct.float32))
            s_idx = sb * TILE_T + ct.arange(TILE_T, dtype=ct.int32).reshape((1, TILE_T))
            pairs = t_idx >= s_idx
            if HAS_SEQ_IDX:
                pairs = pairs & (doc_t == documents(seq_idx, bi, sb, TILE_T))
            log_decay = ct.where(pairs, g_t - g_s, -float("inf"))
            scores = cb * ct.exp2(log_decay) * d_s
            if BF16_MMA:
                # D x_t as D on the diagonal of the diagonal block's scores, whose x_s is x_t: one load of x_t
                scores = scores + ct.where(t_idx == s_idx, d_skip, 0.0)
                acc = ct.mma(scores.astype(ct.bfloat16), x_s, acc)
            else:
                acc = ct.mma(scores.astype(ct.tfloat32), x_s.astype(ct.tfloat32), acc)

        if HAS_D and not BF16_MMA:
            acc = acc + d_skip * token_rows(x, bi, tb, hi, pj, TILE_T, TILE_P, LATENCY).astype(ct.float32)
        ct.store(y, index=(bi, tb, hi, pj), tile=acc.astype(y.dtype).reshape((1, TILE_T, 1, TILE_P)))


@dataclass(frozen=True)
class OutConfig:
    """Block sizes, occupancy and token blocks per program of one compute_out launch (`default_out_config` gives
    the one used untuned). With `blocks` above 1 a program takes that many consecutive token blocks in turn; where
    they do not divide the sequence's blocks, the last program repeats the last block."""

    TILE_T: int = 128
    TILE_P: int = 64
    latency: int = 4
    occupancy: int = 2
    blocks: int = 1


def default_out_config(dtype: torch.dtype) -> OutConfig:
    """The configuration used untuned. With bf16 inputs 128 x 64 tiles at occupancy 2, two token blocks a program:
    faster than one block at the seed shape and with state 64, and tuning chose two blocks at every shape probed
    (docs/kernels.md, compute_out). With others TILE_T 64, one block (their products run in TF32, whose operands
    take twice bf16's registers)."""
    return OutConfig(blocks=2) if dtype == torch.bfloat16 else OutConfig(TILE_T=64)


def search_space(chunk_size: int, headdim: int) -> list[OutConfig]:
    """Configurations worth timing for this chunk size and head dim: each tile pair at occupancy 1 and 2, and at
    occupancy 2 also two token blocks a program; 64-token tiles (128 threads) also at occupancy 4, one or two
    blocks (with state 64 the fastest: docs/kernels.md, compute_out)."""
    space = []
    for tt in (64, 128):
        for tp in (32, 64, 128):
            if tt > chunk_size or tp > max(32, headdim):
                continue
            space += [OutConfig(tt, tp, 4, 1), OutConfig(tt, tp, 4, 2), OutConfig(tt, tp, 4, 2, blocks=2)]
            if tt == 64:
                space += [OutConfig(tt, tp, 4, 4), OutConfig(tt, tp, 4, 4, blocks=2)]
    return space


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, in every dtype, with D, at each dtype's default occupancy: first the seed
    shape's default (bf16: default_out_config, two token blocks a program), then chunks of 64, 128 and 256 over one
    block, and state 64's tuned choice (64-token tiles at occupancy 4); then with seq_idx: the bf16 default, and
    float32's chunk 64 and (64-token tiles over chunks of 256) chunk 256."""
    cases = [
        (name, chunk, tile_t, tile_p, tile_n, blocks, occupancy, False)
        for name in DTYPES
        for chunk, tile_t, tile_p, tile_n, blocks, occupancy in (
            (128, 128, 64, 128, 2, None),
            (64, 64, 64, 64, 1, None),
            (128, 128, 64, 128, 1, None),
            (128, 64, 64, 64, 2, 4),
            (256, 64, 128, 128, 1, None),
        )
    ]
    cases += [
        ("bfloat16", 128, 128, 64, 128, 2, None, True),
        ("float32", 64, 64, 64, 64, 1, None, True),
        ("float32", 256, 64, 128, 128, 1, None, True),
    ]
    f32 = ct.float32
    for name, chunk, tile_t, tile_p, tile_n, blocks, occupancy, has_seq_idx in cases:
        dtype = DTYPES[name]
        occupancy = occupancy or default_out_config(getattr(torch, name)).occupancy
        label = f"compute_out[{name},Q={chunk},T={tile_t},P={tile_p},N={tile_n},blocks={blocks}"
        label += ",seq_idx]" if has_seq_idx else "]"
        yield (
            *hinted(label, compute_out_kernel, occupancy),
            kernel_signature(
                [array(dtype, 4), array(dtype, 4), array(dtype, 4), array(f32, 3), array(f32, 3)]
                + [states_array(name), array(f32, 1), array(dtype, 4)]
                + [8, 4, chunk, tile_t, tile_p, tile_n, True, name == "float32", 4, name == "bfloat16", blocks]
                + [scalar(), *seq_idx_params(has_seq_idx)]
            ),
        )


def compute_out(
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    chunk_states: torch.Tensor,
    D: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stage 3 on the GPU. Same contract as `kernels.reference.compute_out`, y in x's dtype.

    Args:
        x: (b, l, h, p).  B, C: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q) float32.
        chunk_states: (b, c, h, p, n) from `fwd_pass_state`: bfloat16 with bfloat16 inputs, float32 otherwise.
        D: (h,) or None.
        seq_idx: (b, l) int32 document ids, contiguous, non-decreasing along each row, or None.
    Returns:
        y: (b, l, h, p) in x's dtype.
    """
    b, seqlen, h, p = x.shape
    g, n = B.shape[-2:]
    _, _, nchunks, chunk_size = dt_out.shape
    y = torch.empty((b, seqlen, h, p), device=x.device, dtype=x.dtype)
    D32 = None if D is None else D.to(torch.float32).contiguous()
    rows = (b, h, nchunks * chunk_size)
    dt_rows = dt_out.view(rows)

    def spec(cfg: OutConfig) -> tuple[tuple[int, ...], object, tuple]:
        tile_t = min(cfg.TILE_T, chunk_size)
        nblocks = -(-seqlen // tile_t)
        grid = (b * h, -(-nblocks // cfg.blocks), -(-p // cfg.TILE_P))
        args = (x, B, C, dt_rows, dA_cumsum.view(rows), chunk_states, dt_out if D32 is None else D32, y)
        args += (h, h // g, chunk_size, tile_t, cfg.TILE_P, next_pow2(n, 1), D is not None, x.dtype == torch.float32)
        args += (cfg.latency, x.dtype == torch.bfloat16, cfg.blocks, nblocks)
        args += seq_idx_args(seq_idx, dt_rows, chunk_size)
        return grid, with_hints(compute_out_kernel, cfg.occupancy), args

    key = shape_key(x, B, chunk_size, seq_idx)
    launch("compute_out", key, default_out_config(x.dtype), lambda: search_space(chunk_size, p), spec, x.device)
    return y
