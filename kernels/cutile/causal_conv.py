"""SiLU(causal depthwise conv1d) in cuTile, forward and backward: the Mamba-2 block's conv, channels last.

Reference: `model.layers.causal_conv1d_silu` (shifted multiply-adds in PyTorch). With
x (b, l, c), weight w (c, k), bias (c,), and v the pre-activation:

    v[t] = bias + Σ_j w[:, j] · x[t - (k - 1) + j]          (x[s] = 0 for s < 0),   y[t] = SiLU(v[t])
    gv[t] = dy[t] · σ(v[t]) · (1 + v[t] · (1 - σ(v[t])))                            (SiLU's derivative)
    dx[s] = Σ_j w[:, j] · gv[s + (k - 1) - j]   (gv[t] = 0 for t ≥ l)
    dw[:, j] = Σ_{b, t} gv[t] · x[t - (k - 1) + j],   dbias = Σ_{b, t} gv[t]

With document ids seq_idx (b, l) int32 (mamba_ssm's, non-decreasing along a row), a tap reading token s for output t
counts only if seq_idx[s] == seq_idx[t]: in v, in dw's sums, and in dx[s], which sums only the outputs t of s's
document. The kernels take seq_idx under a constant (HAS_SEQ_IDX): without it they compile as they did, the seq_idx
operand being the weight again, never read.

A program owns TILE_T tokens x TILE_C channels of one sequence. The shifted rows are gathers (rows before the
sequence start or past its end read as zero), served from L1/L2 after the first: each element of x is read from HBM
about once. The backward takes two kernels: the first recomputes v (the forward writes only y) once, writes gv in
dy's dtype and per-program partial sums of dw and dbias, rows of one array that one host sum adds up; the second
forms dx from k shifted rows of gv. The gv kernel reads its own rows (the unshifted tap, and dy) by tile loads,
which compile to TMA there; in the forward and dx kernels tile loads compiled no better than the gathers and ran
slower (docs/kernels.md, causal_conv), so those gather. The op's channel parts (Mamba-2's x, B and C)
have an output each and bring up to three gradient arrays: where each is a whole number of column tiles, one forward
launch stores them all (a program stores into the output of its column block's part), and one gv launch takes the
gradients (a program reads the dy of its column block's part), then one dx launch and one sum over all channels;
otherwise each part's kernels (and sum) store into its own output, or its columns of one result. Either way the
parts' outputs and gradients need no cat. A gv program walks `steps` token tiles (its segment), summing gv x each
shifted row and gv elementwise in registers, and reduces over tokens once at the end; its builds take an occupancy
hint (without one they use 255 registers a thread, one program an SM), as the forward's do. Arithmetic in fp32; y
and dx in x's dtype. The backward takes k up to 4 (Mamba-2's d_conv is 4).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import cuda.tile as ct
import torch

from kernels.cutile.launch import ZERO, ConstBool, ConstInt, launch, with_hints
from kernels.cutile.signature import DTYPES, Specialization, array, hinted, kernel_signature, scalar

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _rows(t0, TILE_T: ConstInt, c0, TILE_C: ConstInt):
    """Token indices (TILE_T, 1) and channel indices (1, TILE_C) of a program's tile."""
    t = t0 + ct.arange(TILE_T, dtype=ct.int32).reshape((TILE_T, 1))
    ch = c0 + ct.arange(TILE_C, dtype=ct.int32).reshape((1, TILE_C))
    return t, ch


def _document(seq_idx, bi, t, HAS_SEQ_IDX: ConstBool):
    """The document ids seq_idx[t] of tokens t (TILE_T, 1) (zero past the sequence end); without HAS_SEQ_IDX t
    itself, never read."""
    return ct.gather(seq_idx, (bi, t)) if HAS_SEQ_IDX else t


def _shifted(x, seq_idx, bi, t, doc, ch, K: ConstInt, j: ConstInt, HAS_SEQ_IDX: ConstBool):
    """Tap j's rows x[s], s = t - (K - 1) + j, at tokens t (TILE_T, 1), channels ch (1, TILE_C), in fp32; with
    HAS_SEQ_IDX zero where seq_idx[s] differs from doc, the ids of the tokens t."""
    s = t - (K - 1) + j
    if HAS_SEQ_IDX:
        rows = ct.gather(x, (bi, s, ch), mask=ct.gather(seq_idx, (bi, s)) == doc)
    else:
        rows = ct.gather(x, (bi, s, ch))
    return rows.astype(ct.float32)


def _own(x, bi, ti, cj, TILE_T: ConstInt, TILE_C: ConstInt):
    """The rows of x's tile (bi, ti, cj) in fp32 (TILE_T, TILE_C): a tile load (TMA where the compiler takes it),
    zero past the sequence end and the channels (a tile always starts inside x)."""
    tile = ct.load(x, index=(bi, ti, cj), shape=(1, TILE_T, TILE_C), padding_mode=ZERO)
    return tile.reshape((TILE_T, TILE_C)).astype(ct.float32)


def _tap(
    x,
    seq_idx,
    bi,
    ti,
    cj,
    t,
    doc,
    ch,
    K: ConstInt,
    j: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_SEQ_IDX: ConstBool,
):
    """Tap j's rows x[t - (K - 1) + j] of tile (bi, ti, cj) (zero across documents, as `_shifted`): the unshifted
    tap (j = K - 1, always t's own document) by a tile load, the others by gathers."""
    if j == K - 1:
        return _own(x, bi, ti, cj, TILE_T, TILE_C)
    return _shifted(x, seq_idx, bi, t, doc, ch, K, j, HAS_SEQ_IDX)


def _preactivation(
    x,
    weight,
    bias,
    seq_idx,
    bi,
    t,
    ch,
    K: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_SEQ_IDX: ConstBool,
):
    """v at tokens t (TILE_T, 1) and channels ch (1, TILE_C): fp32 (TILE_T, TILE_C)."""
    v = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    if HAS_BIAS:
        v = v + ct.gather(bias, ch).astype(ct.float32)
    doc = _document(seq_idx, bi, t, HAS_SEQ_IDX)
    for j in range(K):
        w = ct.gather(weight, (ch, j)).astype(ct.float32)
        v = v + w * _shifted(x, seq_idx, bi, t, doc, ch, K, j, HAS_SEQ_IDX)
    return v


@ct.kernel
def conv_fwd_kernel(
    x,  # (b, l, c) bf16/fp16/fp32, last stride 1
    weight,  # (c, K) float32
    bias,  # (c,) float32 (ignored unless HAS_BIAS)
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX)
    y0,  # (b, l, c0) x's dtype: the output of the first channel part, columns [0, c0)
    y1,  # (b, l, c1): the second part's, columns [c0, c0 + c1) (y0 again where there is no second part)
    y2,  # (b, l, c2): the third part's, the columns after (y0 again where there is none)
    end0,  # the column block (of TILE_C) where the second part starts (runtime, as end1: no compile per model shape)
    end1,  # where the third starts; one part: both the number of column blocks
    K: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_SEQ_IDX: ConstBool,
):
    bi = ct.bid(0)
    ti = ct.bid(1)
    cj = ct.bid(2)
    t, ch = _rows(ti * TILE_T, TILE_T, cj * TILE_C, TILE_C)
    v = _preactivation(x, weight, bias, seq_idx, bi, t, ch, K, TILE_T, TILE_C, HAS_BIAS, HAS_SEQ_IDX)
    out = (v / (1.0 + ct.exp(-v))).astype(y0.dtype).reshape((1, TILE_T, TILE_C))
    # the program's part (a program-uniform branch): its output at the part's own column block
    if cj < end0:
        ct.store(y0, index=(bi, ti, cj), tile=out)
    elif cj < end1:
        ct.store(y1, index=(bi, ti, cj - end0), tile=out)
    else:
        ct.store(y2, index=(bi, ti, cj - end1), tile=out)


def _gv_segment(
    x,
    seq_idx,
    dy,
    gv,
    dparams_part,
    ws,
    bi,
    si,
    cj,
    ch,
    lj,
    steps,
    n,
    K: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_SEQ_IDX: ConstBool,
):
    """The gv kernel's work on segment si, column block cj (channels ch; dy read at its part's column block `lj`): n
    token tiles' gv stored, and the segment's partial sums of dw's taps and dbias. ws: the taps' weight rows and the
    bias row (1, TILE_C). The unshifted tap and dy are tile loads, the shifted taps gathers (zero across documents
    with HAS_SEQ_IDX: v's taps and dw's sums alike)."""
    w0, w1, w2, w3, b0 = ws
    acc0 = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)  # Σ over the segment of gv[t] x[t - (K - 1) + j], j = 0..3
    acc1 = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    acc2 = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    acc3 = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    acc_b = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    for s in range(n):
        ti = si * steps + s
        t = ti * TILE_T + ct.arange(TILE_T, dtype=ct.int32).reshape((TILE_T, 1))
        doc = _document(seq_idx, bi, t, HAS_SEQ_IDX)
        # tap K - 1 (x3 at K = 4) is the tile load
        x0 = _tap(x, seq_idx, bi, ti, cj, t, doc, ch, K, 0, TILE_T, TILE_C, HAS_SEQ_IDX)
        x1 = _tap(x, seq_idx, bi, ti, cj, t, doc, ch, K, 1, TILE_T, TILE_C, HAS_SEQ_IDX)
        x2 = _tap(x, seq_idx, bi, ti, cj, t, doc, ch, K, 2, TILE_T, TILE_C, HAS_SEQ_IDX)
        x3 = _tap(x, seq_idx, bi, ti, cj, t, doc, ch, K, 3, TILE_T, TILE_C, HAS_SEQ_IDX)
        v = b0 + w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3
        sg = 1.0 / (1.0 + ct.exp(-v))
        g = _own(dy, bi, ti, lj, TILE_T, TILE_C) * sg * (1.0 + v * (1.0 - sg))  # zero past the end
        ct.store(gv, index=(bi, ti, cj), tile=g.astype(gv.dtype).reshape((1, TILE_T, TILE_C)))
        acc0 = acc0 + g * x0
        acc1 = acc1 + g * x1
        acc2 = acc2 + g * x2
        acc3 = acc3 + g * x3
        acc_b = acc_b + g
    # one reduction over the segment's tokens per program, not one per token tile
    ct.store(dparams_part, index=(bi, si, 0, cj), tile=ct.sum(acc0, axis=0).reshape((1, 1, 1, TILE_C)))
    ct.store(dparams_part, index=(bi, si, 1, cj), tile=ct.sum(acc1, axis=0).reshape((1, 1, 1, TILE_C)))
    ct.store(dparams_part, index=(bi, si, 2, cj), tile=ct.sum(acc2, axis=0).reshape((1, 1, 1, TILE_C)))
    ct.store(dparams_part, index=(bi, si, 3, cj), tile=ct.sum(acc3, axis=0).reshape((1, 1, 1, TILE_C)))
    if HAS_BIAS:  # row 4, after the taps'
        ct.store(dparams_part, index=(bi, si, 4, cj), tile=ct.sum(acc_b, axis=0).reshape((1, 1, 1, TILE_C)))


@ct.kernel
def conv_bwd_gv_kernel(
    x,  # (b, l, c), last stride 1
    weight,  # (c, K) float32
    bias,  # (c,) float32 (ignored unless HAS_BIAS)
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX)
    dy0,  # (b, l, c0) last stride 1: the gradient of the first channel part, columns [0, c0)
    dy1,  # (b, l, c1): the second part's, columns [c0, c0 + c1) (dy0 again where there is no second part)
    dy2,  # (b, l, c2): the third part's, the columns after (dy0 again where there is none)
    gv,  # (b, l, c) dy's dtype: the pre-activation's gradient
    dparams_part,  # (b, segments, 4 + HAS_BIAS, c) float32: each program's share of dw, tap-major (taps past K:
    # unused), then of dbias: one host sum gives both
    steps,  # token tiles per program (a runtime count): a segment is steps * TILE_T tokens
    end0,  # the column block (of TILE_C) where the second part starts (runtime, as end1: no compile per model shape)
    end1,  # where the third starts; one part: both the number of column blocks
    K: ConstInt,  # at most 4: the taps are four named tiles (past K their weight reads as zero)
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_SEQ_IDX: ConstBool,
):
    bi = ct.bid(0)
    si = ct.bid(1)
    cj = ct.bid(2)
    ch = cj * TILE_C + ct.arange(TILE_C, dtype=ct.int32).reshape((1, TILE_C))
    # the taps' weight rows (1, TILE_C), zero past K, and the bias, loaded once for the whole segment
    w0 = ct.gather(weight, (ch, 0)).astype(ct.float32)
    w1 = ct.gather(weight, (ch, 1)).astype(ct.float32)
    w2 = ct.gather(weight, (ch, 2)).astype(ct.float32)
    w3 = ct.gather(weight, (ch, 3)).astype(ct.float32)
    b0 = ct.gather(bias, ch).astype(ct.float32) if HAS_BIAS else ct.zeros((1, TILE_C), dtype=ct.float32)
    ws = (w0, w1, w2, w3, b0)
    # the program's part (program-uniform branches, each its own copy of the loop: a branch inside the loop keeps
    # three parts' addresses live and spills at the default tile): dy at the part's own column block
    n = min(steps, ct.cdiv(x.shape[1], TILE_T) - si * steps)  # token tiles in the segment
    if cj < end0:
        _gv_segment(
            x,
            seq_idx,
            dy0,
            gv,
            dparams_part,
            ws,
            bi,
            si,
            cj,
            ch,
            cj,
            steps,
            n,
            K,
            TILE_T,
            TILE_C,
            HAS_BIAS,
            HAS_SEQ_IDX,
        )
    elif cj < end1:
        _gv_segment(
            x,
            seq_idx,
            dy1,
            gv,
            dparams_part,
            ws,
            bi,
            si,
            cj,
            ch,
            cj - end0,
            steps,
            n,
            K,
            TILE_T,
            TILE_C,
            HAS_BIAS,
            HAS_SEQ_IDX,
        )
    else:
        _gv_segment(
            x,
            seq_idx,
            dy2,
            gv,
            dparams_part,
            ws,
            bi,
            si,
            cj,
            ch,
            cj - end1,
            steps,
            n,
            K,
            TILE_T,
            TILE_C,
            HAS_BIAS,
            HAS_SEQ_IDX,
        )


@ct.kernel
def conv_bwd_dx_kernel(
    gv,  # (b, l, c) the pre-activation's gradient (conv_bwd_gv_kernel), last stride 1
    weight,  # (c, K) float32
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX)
    dx,  # (b, l, c)
    K: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_SEQ_IDX: ConstBool,
):
    bi = ct.bid(0)
    ti = ct.bid(1)
    cj = ct.bid(2)
    t, ch = _rows(ti * TILE_T, TILE_T, cj * TILE_C, TILE_C)
    doc = _document(seq_idx, bi, t, HAS_SEQ_IDX)
    acc = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    # dx[t] = Σ_m w[:, K - 1 - m] · gv[t + m], over the outputs t + m of t's document (with HAS_SEQ_IDX); gv past the
    # sequence end reads as zero
    for m in range(K):
        w = ct.gather(weight, (ch, K - 1 - m)).astype(ct.float32)
        if HAS_SEQ_IDX and m > 0:
            rows = ct.gather(gv, (bi, t + m, ch), mask=ct.gather(seq_idx, (bi, t + m)) == doc)
        else:
            rows = ct.gather(gv, (bi, t + m, ch))
        acc = acc + w * rows.astype(ct.float32)
    ct.store(dx, index=(bi, ti, cj), tile=acc.astype(dx.dtype).reshape((1, TILE_T, TILE_C)))


@dataclass(frozen=True)
class ConvConfig:
    """Tokens and channels per program (powers of two)."""

    TILE_T: int = 32
    TILE_C: int = 128
    steps: int = 1  # the backward's gv kernel: token tiles per program, summed in registers before one reduction
    occupancy: int = 1  # each kernel's occupancy hint (1: none; the gv's builds take 255 registers)


# The tiles that compile without spilling at sm_90 with k = 4, bf16, in the specialization the medium model's step
# launches (strides divisible by 8, 16-byte base addresses): the backward's gv kernel holds the 4 shifted rows and
# their 4 running sums for dw; its dx kernel takes the forward's tiles.
FWD_TILES = ((16, 64), (16, 128), (16, 256), (32, 64), (32, 128), (64, 64))
BWD_TILES = ((8, 64), (8, 128), (16, 64), (32, 64))
BWD_STEPS = (16, 64, 128)  # token tiles a gv program sums in registers (a runtime argument: no compile each)
# occupancy hints of the gv kernel: 2 builds every tile without spilling, 4 only 8 x 64 (the others spill)
BWD_OCCUPANCY = {(8, 64): (1, 2, 4), (8, 128): (1, 2), (16, 64): (1, 2), (32, 64): (1, 2)}
# the forward's: 2 and 4 were faster than the best without a hint at the medium step's layer (docs/kernels.md,
# causal_conv); 8 builds without spilling only at 16 x 128 (63-64 registers, with and without seq_idx)
FWD_OCCUPANCY = {tile: (1, 2, 4, 8) if tile == (16, 128) else (1, 2, 4) for tile in FWD_TILES}
# the dx kernel's: 2 and 4 gained nothing; 8 builds without spilling only at 16 x 128
DX_OCCUPANCY = {tile: (1, 8) if tile == (16, 128) else (1,) for tile in FWD_TILES}
MAX_K = 4  # the gv kernel's taps are four named tiles
# The defaults are the configurations tuning chose at one layer of the medium model's step on both GPUs of the
# shipped table (bf16, with and without document boundaries: docs/kernels.md, causal_conv) before the forward's and
# dx's spaces took occupancy 8, which the H100's search then chose for both (16 x 128; tuned.json); dx takes the
# forward's tiles.
DEFAULT_FWD, DEFAULT_BWD, DEFAULT_DX = ConvConfig(32, 128, 1, 4), ConvConfig(8, 64, 64, 4), ConvConfig(16, 128)


def fwd_space() -> list[ConvConfig]:
    """The forward's configurations tuning times."""
    return [ConvConfig(tt, tc, 1, occupancy) for tt, tc in FWD_TILES for occupancy in FWD_OCCUPANCY[tt, tc]]


def dx_space() -> list[ConvConfig]:
    """The backward's dx kernel's configurations tuning times: the forward's tiles, at DX_OCCUPANCY's hints."""
    return [ConvConfig(tt, tc, 1, occupancy) for tt, tc in FWD_TILES for occupancy in DX_OCCUPANCY[tt, tc]]


def bwd_space() -> list[ConvConfig]:
    """The backward's configurations tuning times."""
    return [
        ConvConfig(tt, tc, steps, occupancy)
        for tt, tc in BWD_TILES
        for steps in BWD_STEPS
        for occupancy in BWD_OCCUPANCY[tt, tc]
    ]


def _signature_arrays(stage: str, dtype: object, seq_idx: bool) -> list:
    """The array and run-time arguments of `stage`'s kernel with x in `dtype`: x, weight, bias, seq_idx, then y0-2,
    end0, end1 (conv_fwd); or dy0-2, gv, dparams_part, steps, end0, end1 (conv_bwd_gv); conv_bwd_dx: gv, weight,
    seq_idx, dx. seq_idx is int32 (b, l) where given, else the weight again (`_document_ids`)."""
    f32 = ct.float32
    ids = array(ct.int32, 2) if seq_idx else array(f32, 2)
    if stage == "conv_bwd_dx":
        return [array(dtype, 3), array(f32, 2), ids, array(dtype, 3)]
    if stage == "conv_fwd":
        outputs = [array(dtype, 3)] * 3 + [scalar()] * 2
    else:
        outputs = [array(dtype, 3)] * 4 + [array(f32, 4)] + [scalar()] * 3
    return [array(dtype, 3), array(f32, 2), array(f32, 1), ids, *outputs]


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, for each of the three kernels: every dtype with the default configuration
    and a bias (first bf16), every tile of its tune space at bf16 without a bias (the forward's and the gv kernel's
    at each of their occupancy hints), and k = 3 (the model's is 4); then each of these again with document ids
    (labels with `,seq_idx`). The dx kernel takes the forward's tiles at its own hints, and no bias."""
    for stage, kernel, tiles, default, hints in (  # hints: each tile's occupancy hints
        ("conv_fwd", conv_fwd_kernel, FWD_TILES, DEFAULT_FWD, FWD_OCCUPANCY),
        ("conv_bwd_gv", conv_bwd_gv_kernel, BWD_TILES, DEFAULT_BWD, BWD_OCCUPANCY),
        ("conv_bwd_dx", conv_bwd_dx_kernel, FWD_TILES, DEFAULT_DX, DX_OCCUPANCY),
    ):
        first, hint = (default.TILE_T, default.TILE_C), default.occupancy
        cases = [(name, 4, first, hint, True) for name in DTYPES]
        cases += [("bfloat16", 4, tile, occupancy, False) for tile in tiles for occupancy in hints[tile]]
        cases.append(("bfloat16", 3, first, hint, True))
        if stage == "conv_bwd_dx":  # no bias: one case per dtype, tile, hint and k
            cases = list(dict.fromkeys((name, k, tile, occupancy, False) for name, k, tile, occupancy, _ in cases))
        for seq_idx in (False, True):
            for name, k, (tile_t, tile_c), occupancy, bias in cases:
                constants = [k, tile_t, tile_c] + ([] if stage == "conv_bwd_dx" else [bias]) + [seq_idx]
                label = f"{stage}[{name},K={k},T={tile_t},C={tile_c}" + (
                    "" if stage == "conv_bwd_dx" else f",bias={bias}"
                )
                label += ",seq_idx]" if seq_idx else "]"
                yield (
                    *hinted(label, kernel, occupancy),
                    kernel_signature([*_signature_arrays(stage, DTYPES[name], seq_idx), *constants]),
                )


def check_inputs(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None = None
) -> None:
    """Raise ValueError for inputs the kernels cannot take."""
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"cutile conv: x must be (b, l, c) and weight (c, k), got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != (x.shape[-1],):
        raise ValueError(f"cutile conv: bias must be ({x.shape[-1]},), got {tuple(bias.shape)}")
    if weight.shape[1] > MAX_K:
        raise ValueError(f"cutile conv: kernel width {weight.shape[1]} is above the {MAX_K} its backward takes")
    if seq_idx is not None and (seq_idx.shape != x.shape[:2] or seq_idx.dtype != torch.int32):
        raise ValueError(
            f"cutile conv: seq_idx must be int32 {tuple(x.shape[:2])}, got {seq_idx.dtype} {tuple(seq_idx.shape)}"
        )
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("seq_idx", seq_idx)):
        if t is not None and not t.is_cuda:
            raise ValueError(f"cutile conv: {name} is on {t.device}; move it to a CUDA device")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"cutile conv: x has dtype {x.dtype}; supported: bfloat16, float16, float32")


def _operands(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None):
    """The kernels' operands: x (last stride 1), the weight and bias in fp32 (the bias slot the weight's first column
    without one), and the document ids (`_document_ids`)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    w32 = weight.to(torch.float32).contiguous()
    b32 = w32[:, 0].contiguous() if bias is None else bias.to(torch.float32).contiguous()
    return x, w32, b32, _document_ids(seq_idx, w32)


def _document_ids(seq_idx: torch.Tensor | None, w32: torch.Tensor) -> torch.Tensor:
    """The kernels' seq_idx operand: the ids (b, l) int32 with last stride 1; without them the fp32 weight (c, k),
    which a kernel built without HAS_SEQ_IDX never reads."""
    if seq_idx is None:
        return w32
    return seq_idx if seq_idx.stride(-1) == 1 else seq_idx.contiguous()


def _key(x: torch.Tensor, k: int, seq_idx: torch.Tensor | None) -> str:
    """The tuning key of a launch on x (b, l, c) with k taps; document ids add `_seq_idx` (more gathers: another
    best configuration, possibly)."""
    b, l, c = x.shape
    return f"b{b}_l{l}_c{c}_k{k}_{str(x.dtype)[6:]}" + ("" if seq_idx is None else "_seq_idx")


MAX_PARTS = 3  # the forward's y arrays and the gv kernel's dy arrays: Mamba-2's x, B and C


def _parts_key(x: torch.Tensor, k: int, sizes: list[int], seq_idx: torch.Tensor | None) -> str:
    """The tuning key of a launch over x's channels: several parts get their sizes appended (the space differs)."""
    key = _key(x, k, seq_idx)
    return key if len(sizes) == 1 else f"{key}_parts{'-'.join(map(str, sizes))}"


def _whole_tiles(sizes: list[int], tile_c: int) -> bool:
    """Whether column tiles of `tile_c` channels never straddle two parts: one part, or each a whole number of tiles."""
    return len(sizes) == 1 or all(n % tile_c == 0 for n in sizes)


def _part_starts(sizes: list[int], tile_c: int, blocks: int, kernel: str) -> tuple[int, int]:
    """The column blocks (of `tile_c`) where the second and third parts start, the kernel's end0 and end1; one part:
    both `blocks`. A ValueError where the tiles straddle two parts (a configuration pinned by tuning.forced)."""
    if not _whole_tiles(sizes, tile_c):
        raise ValueError(f"cutile conv: {kernel} tiles of {tile_c} channels straddle the parts {sizes}")
    return (blocks, blocks) if len(sizes) == 1 else (sizes[0] // tile_c, sum(sizes[:2]) // tile_c)


def _slots(arrays: list[torch.Tensor]) -> list[torch.Tensor]:
    """The kernel's MAX_PARTS array slots: the parts' arrays, unused slots the first part's again."""
    return (arrays + [arrays[0]] * MAX_PARTS)[:MAX_PARTS]


def _fwd_default(sizes: list[int]) -> ConvConfig | None:
    """The forward's default for channel parts of these sizes: DEFAULT_FWD where its column tiles divide every part,
    else the forward tile at its TILE_T (and hint) with the widest TILE_C that does; None where none does."""
    widths = [tc for tt, tc in FWD_TILES if tt == DEFAULT_FWD.TILE_T and all(n % tc == 0 for n in sizes)]
    return None if not widths else replace(DEFAULT_FWD, TILE_C=max(widths))


def _conv_fwd_parts(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    sizes: list[int],
    default: ConvConfig,
    seq_idx: torch.Tensor | None,
) -> list[torch.Tensor]:
    """SiLU(causal depthwise conv1d(x)) in one launch over x's channels (b, l, c), stored as one contiguous
    (b, l, size) output per part: `sizes` are consecutive channel parts adding up to c (one, or up to three, each a
    multiple of the chosen TILE_C: the kernel picks a program's output by its column block). `default`, used
    untuned: DEFAULT_FWD for one part, `_fwd_default(sizes)` for several. seq_idx: (b, l) int32 document ids, or
    None."""
    check_inputs(x, weight, bias, seq_idx)
    x, w32, b32, ids = _operands(x, weight, bias, seq_idx)
    b, l, c = x.shape
    if sum(sizes) != c or not 1 <= len(sizes) <= MAX_PARTS:
        raise ValueError(f"cutile conv: the parts' widths {sizes} must be at most 3 adding up to {c}")
    k = w32.shape[1]
    ys = [torch.empty((b, l, n), device=x.device, dtype=x.dtype) for n in sizes]
    y0, y1, y2 = _slots(ys)

    def space() -> list[ConvConfig]:  # several parts: the tiles whose column blocks never straddle two
        return [cfg for cfg in fwd_space() if _whole_tiles(sizes, cfg.TILE_C)]

    def spec(cfg: ConvConfig):
        blocks = -(-c // cfg.TILE_C)
        end0, end1 = _part_starts(sizes, cfg.TILE_C, blocks, "forward")
        grid = (b, -(-l // cfg.TILE_T), blocks)
        args = (x, w32, b32, ids, y0, y1, y2, end0, end1, k, cfg.TILE_T, cfg.TILE_C, bias is not None)
        return grid, with_hints(conv_fwd_kernel, cfg.occupancy), (*args, seq_idx is not None)

    launch("conv_fwd", _parts_key(x, k, sizes, seq_idx), default, space, spec, x.device)
    return ys


def conv_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None = None
) -> torch.Tensor:
    """SiLU(causal depthwise conv1d(x)). x (b, l, c) (any strides, last 1 or copied), weight (c, k), bias (c,)
    or None, seq_idx (b, l) int32 document ids or None -> y (b, l, c) contiguous, in x's dtype."""
    return _conv_fwd_parts(x, weight, bias, [x.shape[-1]], DEFAULT_FWD, seq_idx)[0]


def _one_launch(sizes: list[int]) -> bool:
    """Whether the backward takes the parts in one gv launch: at most three, each a whole number of the default's
    column tiles (the tuned ones are restricted to tiles dividing every part)."""
    return 1 < len(sizes) <= MAX_PARTS and _whole_tiles(sizes, DEFAULT_BWD.TILE_C)


def _conv_bwd_sums(
    dys: list[torch.Tensor],
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dx: torch.Tensor,
    dparams: torch.Tensor,
    seq_idx: torch.Tensor | None,
) -> None:
    """The backward's kernels on the channels of x (b, l, c): dx into `dx` (b, l, c), and the gv programs' partials
    of dw's four taps and of dbias summed into `dparams` (4 + bias rows, c; fp32). `dys` are the gradients of
    consecutive channel parts adding up to c (one, or up to three, each a multiple of the tuned TILE_C: the gv
    kernel picks a program's part by its column block), so one gv launch, one dx launch and one sum serve them all.
    dx and dparams may be column slices of the op's buffers. seq_idx: (b, l) int32 document ids, or None."""
    check_inputs(x, weight, bias, seq_idx)
    x, w32, b32, ids = _operands(x, weight, bias, seq_idx)
    dys = [dy if dy.stride(-1) == 1 else dy.contiguous() for dy in dys]
    sizes = [dy.shape[-1] for dy in dys]
    if sum(sizes) != x.shape[-1] or len(dys) > MAX_PARTS:
        raise ValueError(f"cutile conv: the gradients' widths {sizes} must be at most 3 adding up to {x.shape[-1]}")
    b, l, c = x.shape
    k = w32.shape[1]
    gv = torch.empty((b, l, c), device=x.device, dtype=dys[0].dtype)
    rows = dparams.shape[0]  # dw's four taps, then dbias's with a bias
    parts: dict[tuple[int, int], torch.Tensor] = {}
    dy0, dy1, dy2 = _slots(dys)
    key = _parts_key(x, k, sizes, seq_idx)
    docs = seq_idx is not None

    def space_gv() -> list[ConvConfig]:  # several parts: the tiles whose column blocks never straddle two
        return [cfg for cfg in bwd_space() if _whole_tiles(sizes, cfg.TILE_C)]

    def spec_gv(cfg: ConvConfig):
        blocks = -(-c // cfg.TILE_C)
        end0, end1 = _part_starts(sizes, cfg.TILE_C, blocks, "gv")
        span = cfg.TILE_T * cfg.steps
        segments = -(-l // span)
        if (cfg.TILE_T, cfg.steps) not in parts:
            parts[cfg.TILE_T, cfg.steps] = torch.empty((b, segments, rows, c), device=x.device, dtype=torch.float32)
        dparams_part = parts[cfg.TILE_T, cfg.steps]
        grid = (b, segments, blocks)
        args = (x, w32, b32, ids, dy0, dy1, dy2, gv, dparams_part, cfg.steps, end0, end1, k, cfg.TILE_T, cfg.TILE_C)
        return grid, with_hints(conv_bwd_gv_kernel, cfg.occupancy), (*args, bias is not None, docs)

    def spec_dx(cfg: ConvConfig):
        grid = (b, -(-l // cfg.TILE_T), -(-c // cfg.TILE_C))
        return grid, with_hints(conv_bwd_dx_kernel, cfg.occupancy), (gv, w32, ids, dx, k, cfg.TILE_T, cfg.TILE_C, docs)

    cfg = launch("conv_bwd", key, DEFAULT_BWD, space_gv, spec_gv, x.device)
    launch("conv_bwd_dx", _key(x, k, seq_idx), DEFAULT_DX, dx_space, spec_dx, x.device)
    # into the column slice in place: a reduction's out= takes its strides (no temporary, no copy kernel)
    torch.sum(parts[cfg.TILE_T, cfg.steps], (0, 1), out=dparams)


def _dparams(c: int, bias: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The summed partials' buffer: dw's four taps, then dbias with a bias; fp32, (4 + bias, c)."""
    return torch.empty((MAX_K + (bias is not None), c), device=device, dtype=torch.float32)


def _param_grads(
    dparams: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dweight (c, k) contiguous in weight's dtype, by one transposing copy of dparams' first k rows (the op's fake
    kernel's layout), and dbias (c,) in bias's dtype: its row as it lies, contiguous, so a float32 bias takes no copy
    (the row starts 16 c bytes in: 16-byte aligned)."""
    dweight = weight.new_empty(weight.shape).copy_(dparams[: weight.shape[1]].t())
    return dweight, None if bias is None else dparams[MAX_K].to(bias.dtype)


def conv_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    seq_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of `conv_fwd`: dx (b, l, c) in x's dtype, dweight (c, k) and dbias (c,) (None without a bias)
    in their parameters' dtypes."""
    dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    dparams = _dparams(x.shape[-1], bias, x.device)
    _conv_bwd_sums([dy], x, weight, bias, dx, dparams, seq_idx)
    return dx, *_param_grads(dparams, weight, bias)


def _bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """The channel range [lo, hi) of each part."""
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    return [(e - n, e) for e, n in zip(ends, sizes)]


# needs_fixed_stride_order: the kernels take any (b, l, c) view with last stride 1, so Inductor must not copy
# strided views (in_proj's xBC columns) to match eager strides exactly.
@torch.library.custom_op(
    "mamba2_cutile::conv_fwd", mutates_args=(), device_types="cuda", tags=(torch.Tag.needs_fixed_stride_order,)
)
def _conv_fwd_op(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, sizes: list[int], seq_idx: torch.Tensor | None
) -> list[torch.Tensor]:
    # parts of whole column tiles (Mamba-2's x, B and C): one launch over all channels stores each program's tile
    # into its column block's part. Otherwise each part is its own conv on a channel slice (a strided view, no
    # copy). Either way contiguous outputs
    default = _fwd_default(sizes) if 1 < len(sizes) <= MAX_PARTS else None  # its tiles divide every part
    if default is not None:
        return _conv_fwd_parts(x, weight, bias, list(sizes), default, seq_idx)
    return [
        conv_fwd(x[..., lo:hi], weight[lo:hi], None if bias is None else bias[lo:hi], seq_idx)
        for lo, hi in _bounds(sizes)
    ]


@_conv_fwd_op.register_fake
def _(x, weight, bias, sizes, seq_idx):
    return [x.new_empty((*x.shape[:-1], n)) for n in sizes]


@torch.library.custom_op(
    "mamba2_cutile::conv_bwd", mutates_args=(), device_types="cuda", tags=(torch.Tag.needs_fixed_stride_order,)
)
def _conv_bwd_op(
    dys: list[torch.Tensor],
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # parts of whole column tiles (Mamba-2's x, B and C): one gv launch picks each program's dy by its column block,
    # then one dx launch and one sum over all channels. Otherwise each part's kernels store into its channel columns
    # of one dx and its sum into those of one dparams. Either way the parameters' gradients take one copy in all,
    # not a sum, transpose and cat of each part's (small launches)
    dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    dparams = _dparams(x.shape[-1], bias, x.device)
    sizes = [dy.shape[-1] for dy in dys]
    if _one_launch(sizes) and len({dy.dtype for dy in dys}) == 1:
        _conv_bwd_sums(list(dys), x, weight, bias, dx, dparams, seq_idx)
    else:
        for dy, (lo, hi) in zip(dys, _bounds(sizes)):
            part_bias = None if bias is None else bias[lo:hi]
            _conv_bwd_sums([dy], x[..., lo:hi], weight[lo:hi], part_bias, dx[..., lo:hi], dparams[:, lo:hi], seq_idx)
    dweight, dbias = _param_grads(dparams, weight, bias)
    return dx, dweight, x.new_empty(0) if dbias is None else dbias


@_conv_bwd_op.register_fake
def _(dys, x, weight, bias, seq_idx):
    dbias = x.new_empty(0) if bias is None else bias.new_empty(bias.shape)
    return torch.empty_like(x, memory_format=torch.contiguous_format), weight.new_empty(weight.shape), dbias


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _, seq_idx = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx)


def _backward(ctx, dys: list[torch.Tensor]):
    x, weight, bias, seq_idx = ctx.saved_tensors
    dx, dweight, dbias = _conv_bwd_op(list(dys), x, weight, bias, seq_idx)
    return dx, dweight, None if bias is None else dbias, None, None


torch.library.register_autograd("mamba2_cutile::conv_fwd", _backward, setup_context=_setup_context)


def causal_conv1d_silu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    sizes: list[int],
    seq_idx: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """SiLU(causal depthwise conv1d(x)) on the GPU, split along channels into parts; differentiable, traced by
    torch.compile as single nodes. The parts' outputs come back apart, and so do their gradients (one launch for
    all parts where each is a whole number of column tiles, else a launch per part on its channel slice), so a model
    that splits the output (Mamba-2's x, B and C) neither copies nor concatenates.

    Args:
        x: (b, l, c) bf16/fp16/fp32 on a CUDA device, last stride 1 (other layouts are copied).
        weight: (c, k), k at most 4.  bias: (c,) or None.
        sizes: the parts' channel counts, positive, adding up to c.
        seq_idx: (b, l) int32 document ids, non-decreasing along a row, or None: a tap reading token s for output t
            counts only if seq_idx[s] == seq_idx[t] (model.layers.causal_conv1d_silu). No gradient.
    Returns:
        one contiguous (b, l, size) tensor per part, in x's dtype.
    """
    if sum(sizes) != x.shape[-1] or min(sizes) < 1:
        raise ValueError(f"cutile conv: sizes {list(sizes)} must be positive and add up to the {x.shape[-1]} channels")
    check_inputs(x, weight, bias, seq_idx)
    return _conv_fwd_op(x, weight, bias, list(sizes), seq_idx)
