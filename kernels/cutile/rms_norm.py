"""The Mamba-2 block's gated RMSNorm in cuTile, forward and backward, in groups of G channels.

Reference: `model.layers.rms_norm`. Per token and group, with v = x · SiLU(z) (or x):

    r = 1 / sqrt(mean(v²) + eps),   n = v · r,   out = n · w
    gn = dout · w,   dv = r · (gn - n · mean(gn · n)),   dw = Σ_tokens dout · n
    dx = dv · SiLU(z),   dz = dv · x · σ(z) · (1 + z · (1 - σ(z)))

A program owns TILE_T tokens of one group and walks the group's columns in blocks of TILE_D (a power of two
dividing G) twice: once for the sums over the group, once to write. The second walk reloads x and z, mostly
from L1/L2. The forward also writes r (one float per token and group) for the backward; the backward writes
per-program partial sums of dw that the host adds up (a program's are a column, so the sum runs along rows).
Arithmetic in fp32; out in the dtype the caller asks for (autocast's under autocast), dx and dz in x's and z's
dtypes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cuda.tile as ct
import torch

from kernels.cutile.launch import ZERO, ConstBool, ConstInt, launch, with_hints
from kernels.cutile.signature import DTYPES, Specialization, array, hinted, kernel_signature, scalar

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _gated(x, z, ti, col, TILE_T: ConstInt, TILE_D: ConstInt, HAS_Z: ConstBool):
    """x and v = x · SiLU(z) of block (ti, col), fp32 (TILE_T, TILE_D); with z, also z's fp32 tile."""
    xv = ct.load(x, index=(ti, col), shape=(TILE_T, TILE_D), padding_mode=ZERO).astype(ct.float32)
    if HAS_Z:
        zv = ct.load(z, index=(ti, col), shape=(TILE_T, TILE_D), padding_mode=ZERO).astype(ct.float32)
        return xv, xv * zv / (1.0 + ct.exp(-zv)), zv
    return xv, xv, xv


@ct.kernel
def norm_fwd_kernel(
    x,  # (N, d) bf16/fp16/fp32, last stride 1
    z,  # (N, d) last stride 1 (ignored unless HAS_Z)
    weight,  # (d,) float32
    out,  # (N, d) the output dtype
    rstd,  # (N, d / G) float32, written
    eps: float,
    G: ConstInt,
    TILE_T: ConstInt,
    TILE_D: ConstInt,
    HAS_Z: ConstBool,
):
    ti = ct.bid(0)
    gi = ct.bid(1)
    blocks = G // TILE_D
    ss = ct.zeros((TILE_T, 1), dtype=ct.float32)
    for j in range(blocks):
        _, v, _ = _gated(x, z, ti, gi * blocks + j, TILE_T, TILE_D, HAS_Z)
        ss = ss + ct.sum(v * v, axis=1, keepdims=True)
    r = ct.rsqrt(ss / G + eps)
    ct.store(rstd, index=(ti, gi), tile=r)
    for j in range(blocks):
        col = gi * blocks + j
        _, v, _ = _gated(x, z, ti, col, TILE_T, TILE_D, HAS_Z)
        w = ct.load(weight, index=(col,), shape=(TILE_D,)).reshape((1, TILE_D))
        ct.store(out, index=(ti, col), tile=(v * r * w).astype(out.dtype))


@ct.kernel
def norm_bwd_kernel(
    x,  # (N, d), last stride 1
    z,  # (N, d), last stride 1 (ignored unless HAS_Z)
    weight,  # (d,) float32
    rstd,  # (N, d / G) float32 from the forward
    dout,  # (N, d), last stride 1
    dx,  # (N, d) x's dtype
    dz,  # (N, d) z's dtype (ignored unless HAS_Z)
    dweight_part,  # (d, N / TILE_T) float32: each program's share of dw, a column (the host sums along rows)
    G: ConstInt,
    TILE_T: ConstInt,
    TILE_D: ConstInt,
    HAS_Z: ConstBool,
):
    ti = ct.bid(0)
    gi = ct.bid(1)
    blocks = G // TILE_D
    r = ct.load(rstd, index=(ti, gi), shape=(TILE_T, 1), padding_mode=ZERO)
    dot = ct.zeros((TILE_T, 1), dtype=ct.float32)  # Σ over the group of gn · n
    for j in range(blocks):
        col = gi * blocks + j
        _, v, _ = _gated(x, z, ti, col, TILE_T, TILE_D, HAS_Z)
        w = ct.load(weight, index=(col,), shape=(TILE_D,)).reshape((1, TILE_D))
        g = ct.load(dout, index=(ti, col), shape=(TILE_T, TILE_D), padding_mode=ZERO).astype(ct.float32)
        dot = dot + ct.sum(g * w * v * r, axis=1, keepdims=True)
    mean = dot / G
    for j in range(blocks):
        col = gi * blocks + j
        xv, v, zv = _gated(x, z, ti, col, TILE_T, TILE_D, HAS_Z)
        w = ct.load(weight, index=(col,), shape=(TILE_D,)).reshape((1, TILE_D))
        g = ct.load(dout, index=(ti, col), shape=(TILE_T, TILE_D), padding_mode=ZERO).astype(ct.float32)
        n = v * r
        dv = r * (g * w - n * mean)
        ct.store(dweight_part, index=(col, ti), tile=ct.sum(g * n, axis=0, keepdims=True).reshape((TILE_D, 1)))
        if HAS_Z:
            s = 1.0 / (1.0 + ct.exp(-zv))
            ct.store(dx, index=(ti, col), tile=(dv * zv * s).astype(dx.dtype))
            ct.store(dz, index=(ti, col), tile=(dv * xv * s * (1.0 + zv * (1.0 - s))).astype(dz.dtype))
        else:
            ct.store(dx, index=(ti, col), tile=dv.astype(dx.dtype))


@dataclass(frozen=True)
class NormConfig:
    """Tokens per program and columns per block (powers of two; the host caps TILE_D to divide the group), and
    the occupancy hint: without one the compiler stages every block's loads in shared memory (at sm_90 with the
    medium model's group of 1536), one program per SM."""

    TILE_T: int = 16
    TILE_D: int = 256
    occupancy: int = 1


# Tiles of at most 4096 elements: a program holds a few fp32 tiles of this size per block.
BWD_TILES = ((8, 256), (16, 128), (16, 256), (32, 128))
BWD_OCCUPANCY = (1, 2, 4)
# The forward gains from smaller tiles at higher occupancy, the backward not: each of its programs writes a row of
# dw partial sums, and smaller tiles write more. Summing them over segments of 4-16 token tiles in registers lost
# too (docs/kernels.md, rms_norm).
FWD_TILES = ((4, 256), (4, 512), (8, 256), (16, 128), (32, 128))
FWD_OCCUPANCY = (1, 2, 4, 8)
# The fastest at one layer of the medium model's step, tuned, bf16: occupancy 4 beat 1 forward and backward, and
# 4 x 512 at occupancy 8 beat it forward (docs/kernels.md, rms_norm).
DEFAULT_FWD, DEFAULT_BWD = NormConfig(4, 512, 8), NormConfig(32, 128, 4)


def fwd_space() -> list[NormConfig]:
    """The forward's configurations tuning times."""
    return [NormConfig(tt, td, occ) for tt, td in FWD_TILES for occ in FWD_OCCUPANCY]


def bwd_space() -> list[NormConfig]:
    """The backward's configurations tuning times."""
    return [NormConfig(tt, td, occ) for tt, td in BWD_TILES for occ in BWD_OCCUPANCY]


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles at the medium model's group of 1536 channels, for both kernels: every dtype
    with the default configuration and a gate (first bf16), every other tile of the tune spaces at each occupancy
    hint at bf16, and no gate. The output (forward) and its gradient (backward) in bf16, as under autocast."""
    f32, bf16 = ct.float32, ct.bfloat16
    group = 1536
    for stage, kernel, default, tiles, hints in (
        ("norm_fwd", norm_fwd_kernel, DEFAULT_FWD, FWD_TILES, FWD_OCCUPANCY),
        ("norm_bwd", norm_bwd_kernel, DEFAULT_BWD, BWD_TILES, BWD_OCCUPANCY),
    ):
        first = (default.TILE_T, default.TILE_D, default.occupancy)
        cases = [(name, first, True) for name in DTYPES]
        cases += [("bfloat16", (*tile, occ), True) for tile in tiles for occ in hints if (*tile, occ) != first]
        cases.append(("bfloat16", first, False))
        for name, (tile_t, tile_d, occupancy), gate in cases:
            dtype = DTYPES[name]
            if stage == "norm_fwd":  # x, z, weight, out, rstd, eps
                arrays = [array(dtype, 2), array(dtype, 2), array(f32, 1), array(bf16, 2), array(f32, 2), scalar(f32)]
            else:  # x, z, weight, rstd, dout, dx, dz, dweight_part
                arrays = [array(dtype, 2), array(dtype, 2), array(f32, 1), array(f32, 2), array(bf16, 2)]
                arrays += [array(dtype, 2), array(dtype, 2), array(f32, 2)]
            label = f"{stage}[{name},G={group},T={tile_t},D={tile_d},gate={gate}]"
            yield *hinted(label, kernel, occupancy), kernel_signature([*arrays, group, tile_t, tile_d, gate])


def block_width(group_size: int, tile_d: int) -> int:
    """The largest power of two at most tile_d that divides group_size (its columns blocks never straddle two
    groups). ValueError if that is below 16."""
    width = min(tile_d, group_size & -group_size)
    if width < 16:
        raise ValueError(f"cutile rms_norm: group size {group_size} must be a multiple of 16")
    return width


def check_inputs(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, group_size: int) -> None:
    """Raise ValueError for inputs the kernels cannot take."""
    d = x.shape[-1]
    if weight.shape != (d,) or (z is not None and z.shape != x.shape):
        got = (tuple(x.shape), tuple(weight.shape), None if z is None else tuple(z.shape))
        raise ValueError(f"cutile rms_norm: x (..., d), weight (d,), z like x or None; got {got}")
    if d % group_size != 0:
        raise ValueError(f"cutile rms_norm: dim {d} is not a multiple of the group size {group_size}")
    block_width(group_size, 16)
    for name, t in (("x", x), ("weight", weight), ("z", z)):
        if t is not None and not t.is_cuda:
            raise ValueError(f"cutile rms_norm: {name} is on {t.device}; move it to a CUDA device")
        if t is not None and t is not weight and t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"cutile rms_norm: {name} has dtype {t.dtype}; supported: bfloat16, float16, float32")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., d) -> (N, d) with last stride 1: a view where the strides allow it, else a copy."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _key(x: torch.Tensor, group_size: int, has_z: bool) -> str:
    return f"N{x.numel() // x.shape[-1]}_d{x.shape[-1]}_G{group_size}_z{int(has_z)}_{str(x.dtype)[6:]}"


def norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    z: torch.Tensor | None,
    group_size: int,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out (x's shape, contiguous, out_dtype) and rstd (N, d / group_size) float32, N the tokens."""
    check_inputs(x, weight, z, group_size)
    x2, z2 = _rows(x), None if z is None else _rows(z)
    n_rows, d = x2.shape
    w32 = weight.to(torch.float32).contiguous()
    out = torch.empty((n_rows, d), device=x.device, dtype=out_dtype)
    rstd = torch.empty((n_rows, d // group_size), device=x.device, dtype=torch.float32)

    def spec(cfg: NormConfig):
        grid = (-(-n_rows // cfg.TILE_T), d // group_size)
        td = block_width(group_size, cfg.TILE_D)
        args = (x2, x2 if z2 is None else z2, w32, out, rstd, eps, group_size, cfg.TILE_T, td, z is not None)
        return grid, with_hints(norm_fwd_kernel, cfg.occupancy), args

    launch("norm_fwd", _key(x, group_size, z is not None), DEFAULT_FWD, fwd_space, spec, x.device)
    return out.view(x.shape), rstd


def norm_bwd(
    dout: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    z: torch.Tensor | None,
    rstd: torch.Tensor,
    group_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Gradients of `norm_fwd`'s out: dx (x's shape and dtype), dz (z's, None without z), dweight (weight's)."""
    check_inputs(x, weight, z, group_size)
    x2, z2, g2 = _rows(x), None if z is None else _rows(z), _rows(dout)
    n_rows, d = x2.shape
    w32 = weight.to(torch.float32).contiguous()
    dx = torch.empty((n_rows, d), device=x.device, dtype=x.dtype)
    dz = dx if z is None else torch.empty((n_rows, d), device=x.device, dtype=z.dtype)
    parts: dict[int, torch.Tensor] = {}

    def spec(cfg: NormConfig):
        nt = -(-n_rows // cfg.TILE_T)
        if cfg.TILE_T not in parts:
            parts[cfg.TILE_T] = torch.empty((d, nt), device=x.device, dtype=torch.float32)
        td = block_width(group_size, cfg.TILE_D)
        args = (x2, x2 if z2 is None else z2, w32, rstd, g2, dx, dz, parts[cfg.TILE_T], group_size, cfg.TILE_T, td)
        return (nt, d // group_size), with_hints(norm_bwd_kernel, cfg.occupancy), (*args, z is not None)

    cfg = launch("norm_bwd", _key(x, group_size, z is not None), DEFAULT_BWD, bwd_space, spec, x.device)
    # along contiguous rows: a sum down the columns of (N / TILE_T, d) was slower (docs/kernels.md, rms_norm)
    dweight = parts[cfg.TILE_T].sum(1).to(weight.dtype)
    return dx.view(x.shape), None if z is None else dz.view(z.shape), dweight


# needs_fixed_stride_order: the kernels read rows of any (b, l, d) view with last stride 1 (the gate z is a view of
# in_proj's output, padded by Inductor), so Inductor must not copy them to match eager strides exactly.
@torch.library.custom_op(
    "mamba2_cutile::norm_fwd", mutates_args=(), device_types="cuda", tags=(torch.Tag.needs_fixed_stride_order,)
)
def _norm_fwd_op(
    x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor | None, group_size: int, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    return norm_fwd(x, weight, eps, z, group_size, out_dtype)


@_norm_fwd_op.register_fake
def _(x, weight, eps, z, group_size, out_dtype):
    rows = x.numel() // x.shape[-1]
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty((rows, x.shape[-1] // group_size), dtype=torch.float32)


@torch.library.custom_op(
    "mamba2_cutile::norm_bwd", mutates_args=(), device_types="cuda", tags=(torch.Tag.needs_fixed_stride_order,)
)
def _norm_bwd_op(
    dout: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    z: torch.Tensor | None,
    rstd: torch.Tensor,
    group_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dz, dweight = norm_bwd(dout, x, weight, z, rstd, group_size)
    return dx, x.new_empty(0) if dz is None else dz, dweight


@_norm_bwd_op.register_fake
def _(dout, x, weight, z, rstd, group_size):
    dz = x.new_empty(0) if z is None else z.new_empty(z.shape)
    return x.new_empty(x.shape), dz, weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _, z, group_size, _ = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.group_size = group_size
    ctx.save_for_backward(x, weight, z, output[1])


def _backward(ctx, dout: torch.Tensor, _drstd: torch.Tensor | None):
    x, weight, z, rstd = ctx.saved_tensors
    dx, dz, dweight = _norm_bwd_op(dout, x, weight, z, rstd, ctx.group_size)
    return dx, dweight, None, None if z is None else dz, None, None


torch.library.register_autograd("mamba2_cutile::norm_fwd", _backward, setup_context=_setup_context)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    z: torch.Tensor | None,
    group_size: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """weight · v / rms(v) over groups of `group_size` channels, v = x · SiLU(z) (or x), on the GPU;
    differentiable, traced by torch.compile as single nodes.

    Args:
        x, z: (..., d) bf16/fp16/fp32 on a CUDA device (z may be None).  weight: (d,).
        group_size: divides d, a multiple of 16.  out_dtype: the output's dtype.
    Returns:
        (..., d) contiguous, in out_dtype.
    """
    check_inputs(x, weight, z, group_size)
    return _norm_fwd_op(x, weight, eps, z, group_size, out_dtype)[0]
