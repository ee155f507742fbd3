"""SiLU(causal depthwise conv1d) in cuTile, forward and backward: the Mamba-2 block's conv, channels last.

Reference: `lightning_modules.model.layers.causal_conv1d_silu` (shifted multiply-adds in PyTorch). With
x (b, l, c), weight w (c, k), bias (c,), and v the pre-activation:

    v[t] = bias + Σ_j w[:, j] · x[t - (k - 1) + j]          (x[s] = 0 for s < 0),   y[t] = SiLU(v[t])
    gv[t] = dy[t] · σ(v[t]) · (1 + v[t] · (1 - σ(v[t])))                            (SiLU's derivative)
    dx[s] = Σ_j w[:, j] · gv[s + (k - 1) - j]   (gv[t] = 0 for t ≥ l)
    dw[:, j] = Σ_{b, t} gv[t] · x[t - (k - 1) + j],   dbias = Σ_{b, t} gv[t]

A program owns TILE_T tokens x TILE_C channels of one sequence. The shifted rows are gathers (rows before the
sequence start or past its end read as zero), served from L1/L2 after the first: each element of x is read
from HBM about once. The backward takes two kernels: the first recomputes v (the forward writes only y) once,
writes gv in dy's dtype and per-program partial sums of dw and dbias that the host adds up; the second forms dx
from k shifted rows of gv. Arithmetic in fp32; y and dx in x's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.tile as ct
import torch

from kernels.cutile.launch import ConstBool, ConstInt, launch

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _rows(t0, TILE_T: ConstInt, c0, TILE_C: ConstInt):
    """Token indices (TILE_T, 1) and channel indices (1, TILE_C) of a program's tile."""
    t = t0 + ct.arange(TILE_T, dtype=ct.int32).reshape((TILE_T, 1))
    ch = c0 + ct.arange(TILE_C, dtype=ct.int32).reshape((1, TILE_C))
    return t, ch


def _preactivation(x, weight, bias, bi, t, ch, K: ConstInt, TILE_T: ConstInt, TILE_C: ConstInt, HAS_BIAS: ConstBool):
    """v at tokens t (TILE_T, 1) and channels ch (1, TILE_C): fp32 (TILE_T, TILE_C)."""
    v = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    if HAS_BIAS:
        v = v + ct.gather(bias, ch).astype(ct.float32)
    for j in range(K):
        w = ct.gather(weight, (ch, j)).astype(ct.float32)
        v = v + w * ct.gather(x, (bi, t - (K - 1) + j, ch)).astype(ct.float32)
    return v


@ct.kernel
def conv_fwd_kernel(
    x,  # (b, l, c) bf16/fp16/fp32, last stride 1
    weight,  # (c, K) float32
    bias,  # (c,) float32 (ignored unless HAS_BIAS)
    y,  # (b, l, c) x's dtype
    K: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_BIAS: ConstBool,
):
    bi = ct.bid(0)
    ti = ct.bid(1)
    cj = ct.bid(2)
    t, ch = _rows(ti * TILE_T, TILE_T, cj * TILE_C, TILE_C)
    v = _preactivation(x, weight, bias, bi, t, ch, K, TILE_T, TILE_C, HAS_BIAS)
    out = v / (1.0 + ct.exp(-v))
    ct.store(y, index=(bi, ti, cj), tile=out.astype(y.dtype).reshape((1, TILE_T, TILE_C)))


@ct.kernel
def conv_bwd_gv_kernel(
    x,  # (b, l, c), last stride 1
    weight,  # (c, K) float32
    bias,  # (c,) float32 (ignored unless HAS_BIAS)
    dy,  # (b, l, c) last stride 1
    gv,  # (b, l, c) dy's dtype: the pre-activation's gradient
    dweight_part,  # (b, l / TILE_T, c, K) float32: each program's share of dw
    dbias_part,  # (b, l / TILE_T, c) float32
    K: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
    HAS_BIAS: ConstBool,
):
    bi = ct.bid(0)
    ti = ct.bid(1)
    cj = ct.bid(2)
    t, ch = _rows(ti * TILE_T, TILE_T, cj * TILE_C, TILE_C)
    v = _preactivation(x, weight, bias, bi, t, ch, K, TILE_T, TILE_C, HAS_BIAS)
    s = 1.0 / (1.0 + ct.exp(-v))
    g = ct.gather(dy, (bi, t, ch)).astype(ct.float32) * s * (1.0 + v * (1.0 - s))  # zero past the sequence end
    ct.store(gv, index=(bi, ti, cj), tile=g.astype(gv.dtype).reshape((1, TILE_T, TILE_C)))
    for j in range(K):  # the shifted rows again (from L1/L2): dw[:, j] = Σ_t gv[t] x[t - (K - 1) + j]
        dw = ct.sum(g * ct.gather(x, (bi, t - (K - 1) + j, ch)).astype(ct.float32), axis=0)  # (TILE_C,)
        ct.scatter(dweight_part, (bi, ti, ch.reshape((TILE_C,)), j), dw)
    ct.store(dbias_part, index=(bi, ti, cj), tile=ct.sum(g, axis=0).reshape((1, 1, TILE_C)))


@ct.kernel
def conv_bwd_dx_kernel(
    gv,  # (b, l, c) the pre-activation's gradient (conv_bwd_gv_kernel), last stride 1
    weight,  # (c, K) float32
    dx,  # (b, l, c)
    K: ConstInt,
    TILE_T: ConstInt,
    TILE_C: ConstInt,
):
    bi = ct.bid(0)
    ti = ct.bid(1)
    cj = ct.bid(2)
    t, ch = _rows(ti * TILE_T, TILE_T, cj * TILE_C, TILE_C)
    acc = ct.zeros((TILE_T, TILE_C), dtype=ct.float32)
    for m in range(K):  # dx[t] = Σ_m w[:, K - 1 - m] · gv[t + m]; gv past the sequence end reads as zero
        w = ct.gather(weight, (ch, K - 1 - m)).astype(ct.float32)
        acc = acc + w * ct.gather(gv, (bi, t + m, ch)).astype(ct.float32)
    ct.store(dx, index=(bi, ti, cj), tile=acc.astype(dx.dtype).reshape((1, TILE_T, TILE_C)))


@dataclass(frozen=True)
class ConvConfig:
    """Tokens and channels per program (powers of two)."""

    TILE_T: int = 32
    TILE_C: int = 128


# The tiles that compile without spilling at sm_90 with k = 4, bf16, in the specialization the medium model's step
# launches (strides divisible by 8, 16-byte base addresses): the backward's gv kernel holds the k shifted rows and
# their k column sums for dw; its dx kernel takes the forward's tiles.
FWD_TILES = ((16, 64), (16, 128), (16, 256), (32, 64), (32, 128), (64, 64))
BWD_TILES = ((16, 64), (16, 128), (32, 64), (64, 64), (64, 128))
# The backward's defaults are its two kernels' fastest tiles at one layer of the medium model's step (tuned, bf16:
# results/probes/layers_two_pass_and_occupancy_2026-12-01.txt); its dx kernel takes the forward's tiles.
DEFAULT_FWD, DEFAULT_BWD, DEFAULT_DX = ConvConfig(32, 128), ConvConfig(64, 128), ConvConfig(16, 128)


def fwd_space() -> list[ConvConfig]:
    """The forward's configurations tuning times."""
    return [ConvConfig(tt, tc) for tt, tc in FWD_TILES]


def bwd_space() -> list[ConvConfig]:
    """The backward's configurations tuning times."""
    return [ConvConfig(tt, tc) for tt, tc in BWD_TILES]


def check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise ValueError for inputs the kernels cannot take."""
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"cutile conv: x must be (b, l, c) and weight (c, k), got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != (x.shape[-1],):
        raise ValueError(f"cutile conv: bias must be ({x.shape[-1]},), got {tuple(bias.shape)}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and not t.is_cuda:
            raise ValueError(f"cutile conv: {name} is on {t.device}; move it to a CUDA device")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"cutile conv: x has dtype {x.dtype}; supported: bfloat16, float16, float32")


def _operands(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    x = x if x.stride(-1) == 1 else x.contiguous()
    w32 = weight.to(torch.float32).contiguous()
    b32 = w32[:, 0].contiguous() if bias is None else bias.to(torch.float32).contiguous()
    return x, w32, b32


def _key(x: torch.Tensor, k: int) -> str:
    b, l, c = x.shape
    return f"b{b}_l{l}_c{c}_k{k}_{str(x.dtype)[6:]}"


def conv_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """SiLU(causal depthwise conv1d(x)). x (b, l, c) (any strides, last 1 or copied), weight (c, k), bias (c,)
    or None -> y (b, l, c) contiguous, in x's dtype."""
    check_inputs(x, weight, bias)
    x, w32, b32 = _operands(x, weight, bias)
    b, l, c = x.shape
    k = w32.shape[1]
    y = torch.empty((b, l, c), device=x.device, dtype=x.dtype)

    def spec(cfg: ConvConfig):
        grid = (b, -(-l // cfg.TILE_T), -(-c // cfg.TILE_C))
        return grid, conv_fwd_kernel, (x, w32, b32, y, k, cfg.TILE_T, cfg.TILE_C, bias is not None)

    launch("conv_fwd", _key(x, k), DEFAULT_FWD, fwd_space, spec, x.device)
    return y


def conv_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of `conv_fwd`: dx (b, l, c) in x's dtype, dweight (c, k) and dbias (c,) (None without a bias)
    in their parameters' dtypes."""
    check_inputs(x, weight, bias)
    x, w32, b32 = _operands(x, weight, bias)
    dy = dy if dy.stride(-1) == 1 else dy.contiguous()
    b, l, c = x.shape
    k = w32.shape[1]
    gv = torch.empty((b, l, c), device=x.device, dtype=dy.dtype)
    dx = torch.empty((b, l, c), device=x.device, dtype=x.dtype)
    parts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def spec_gv(cfg: ConvConfig):
        nt = -(-l // cfg.TILE_T)
        if cfg.TILE_T not in parts:
            parts[cfg.TILE_T] = (
                torch.empty((b, nt, c, k), device=x.device, dtype=torch.float32),
                torch.empty((b, nt, c), device=x.device, dtype=torch.float32),
            )
        dw, db = parts[cfg.TILE_T]
        grid = (b, nt, -(-c // cfg.TILE_C))
        return grid, conv_bwd_gv_kernel, (x, w32, b32, dy, gv, dw, db, k, cfg.TILE_T, cfg.TILE_C, bias is not None)

    def spec_dx(cfg: ConvConfig):
        grid = (b, -(-l // cfg.TILE_T), -(-c // cfg.TILE_C))
        return grid, conv_bwd_dx_kernel, (gv, w32, dx, k, cfg.TILE_T, cfg.TILE_C)

    cfg = launch("conv_bwd", _key(x, k), DEFAULT_BWD, bwd_space, spec_gv, x.device)
    launch("conv_bwd_dx", _key(x, k), DEFAULT_DX, fwd_space, spec_dx, x.device)
    dw, db = parts[cfg.TILE_T]
    dweight = dw.sum((0, 1)).to(weight.dtype)
    dbias = None if bias is None else db.sum((0, 1)).to(bias.dtype)
    return dx, dweight, dbias


@torch.library.custom_op("mamba2_cutile::conv_fwd", mutates_args=(), device_types="cuda")
def _conv_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return conv_fwd(x, weight, bias)


@_conv_fwd_op.register_fake
def _(x, weight, bias):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("mamba2_cutile::conv_bwd", mutates_args=(), device_types="cuda")
def _conv_bwd_op(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dweight, dbias = conv_bwd(dy, x, weight, bias)
    return dx, dweight, x.new_empty(0) if dbias is None else dbias


@_conv_bwd_op.register_fake
def _(dy, x, weight, bias):
    dbias = x.new_empty(0) if bias is None else bias.new_empty(bias.shape)
    return torch.empty_like(x, memory_format=torch.contiguous_format), weight.new_empty(weight.shape), dbias


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight, bias)


def _backward(ctx, dy: torch.Tensor):
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = _conv_bwd_op(dy, x, weight, bias)
    return dx, dweight, None if bias is None else dbias


torch.library.register_autograd("mamba2_cutile::conv_fwd", _backward, setup_context=_setup_context)


def causal_conv1d_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """SiLU(causal depthwise conv1d(x)) on the GPU, differentiable; traced by torch.compile as single nodes.

    Args:
        x: (b, l, c) bf16/fp16/fp32 on a CUDA device, last stride 1 (other layouts are copied).
        weight: (c, k).  bias: (c,) or None.
    Returns:
        y: (b, l, c) contiguous, in x's dtype.
    """
    check_inputs(x, weight, bias)
    return _conv_fwd_op(x, weight, bias)
