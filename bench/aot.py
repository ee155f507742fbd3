"""Ahead-of-time compilation of every kernel (the SSD's, the causal conv's and the gated RMSNorm's, forward and
backward) to cubins, with no GPU present.

CI runs `export_all("sm_90")` and `export_all("sm_100")`, so a kernel that stops compiling for
Hopper or Blackwell fails CI. Each kernel is compiled for the specializations the SSD launches:
chunk sizes 64/128/256 (the backward: 64, its own chunk size at every forward chunk of 64 or more, chunk_cumsum
there with its log2(e) row; bwd_dbc also at 16 and 32, the chunks of smaller forward chunks), bf16/fp16/fp32
inputs, with and without the optional inputs; fwd_pass_state taking one and two chunks an iteration.

    python -m bench.aot sm_90 sm_100
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Iterator

import cuda.tile as ct
import torch
from cuda.tile import compilation as ctc

from kernels.cutile.bwd_dbc import DbcConfig, bwd_dbc_kernel
from kernels.cutile.bwd_dx import bwd_dx_kernel, default_dx_config
from kernels.cutile.bwd_pass_state import bwd_pass_state_kernel
from kernels.cutile.causal_conv import (
    BWD_OCCUPANCY,
    BWD_TILES,
    DEFAULT_BWD,
    DEFAULT_DX,
    DEFAULT_FWD,
    FWD_OCCUPANCY,
    FWD_TILES,
    conv_bwd_dx_kernel,
    conv_bwd_gv_kernel,
    conv_fwd_kernel,
)
from kernels.cutile.chunk_cumsum import chunk_cumsum_kernel
from kernels.cutile.chunk_cumsum_bwd import CumsumBwdConfig, chunk_cumsum_bwd_kernel
from kernels.cutile.compute_out import compute_out_kernel, default_out_config
from kernels.cutile.fwd_pass_state import StateConfig, fwd_pass_state_kernel, states_dtype
from kernels.cutile.launch import with_hints
from kernels.cutile.rms_norm import BWD_OCCUPANCY as NORM_BWD_OCCUPANCY
from kernels.cutile.rms_norm import BWD_TILES as NORM_BWD_TILES
from kernels.cutile.rms_norm import DEFAULT_BWD as NORM_BWD
from kernels.cutile.rms_norm import DEFAULT_FWD as NORM_FWD
from kernels.cutile.rms_norm import FWD_OCCUPANCY as NORM_FWD_OCCUPANCY
from kernels.cutile.rms_norm import FWD_TILES as NORM_FWD_TILES
from kernels.cutile.rms_norm import norm_bwd_kernel, norm_fwd_kernel
from kernels.cutile.ssd import BACKWARD_CHUNK
from kernels.cutile.state_walks import state_walks_kernel

DTYPES = {"bfloat16": ct.bfloat16, "float16": ct.float16, "float32": ct.float32}


def _states(name: str):
    """The cuTile dtype of the chunk states and their gradients with `name` inputs (fwd_pass_state.states_dtype)."""
    return DTYPES[str(states_dtype(getattr(torch, name))).removeprefix("torch.")]


def _array(dtype, ndim: int, index_dtype=ct.int64, divisible: tuple[int, ...] = (), base: int = 1):
    """An array argument with its last stride 1. CI's signatures assume nothing more; a launch's specialization
    (results/probes) may also give 32-bit indices, the other strides' divisors and the base address's."""
    return ctc.ArrayConstraint(
        dtype,
        ndim,
        index_dtype=index_dtype,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[*divisible, 1] if divisible else 1,
        base_addr_divisible_by=base,
    )


def _signature(params: list) -> ctc.KernelSignature:
    return ctc.KernelSignature(params, calling_convention=ctc.CallingConvention.cutile_python_v2())


def _hinted(label: str, kernel: object, occupancy: int, worker_warps: int = 0) -> tuple[str, object]:
    """The label and kernel object a launch with these hints compiles (as the host functions' with_hints calls)."""
    if occupancy == 1 and not worker_warps:
        return label, kernel
    return f"{label[:-1]},occupancy={occupancy}]", with_hints(kernel, occupancy, worker_warps)


def _cumsum_signature(dtype, chunk: int, softplus: bool, log2: bool = False) -> ctc.KernelSignature:
    """chunk_cumsum_kernel's signature: dt in `dtype`, A and dt_bias, the three (b, h, c·Q) float32 rows, seqlen,
    the chunk, 8 heads a program, dt_bias given, softplus and log2 as named."""
    f32 = ct.float32
    return _signature(
        [_array(dtype, 3), _array(f32, 1), _array(f32, 1)]
        + [_array(f32, 3)] * 3
        + [ctc.ScalarConstraint(ct.int32), chunk, 8, True, softplus, log2]
    )


def signatures() -> Iterator[tuple[str, object, ctc.KernelSignature]]:
    """(label, kernel, signature) for the forward's specializations, each kernel with its default's hints."""
    f32 = ct.float32
    for name, dtype in DTYPES.items():
        for softplus in (False, True):
            yield (
                f"chunk_cumsum[{name},softplus={softplus}]",
                chunk_cumsum_kernel,
                _cumsum_signature(dtype, 128, softplus),
            )
    for name, dtype in DTYPES.items():
        for chunk, tile_p, tile_n, has_init, step, occupancy in (
            (64, 64, 64, True, 1, StateConfig().occupancy),
            (64, 64, 32, True, 2, StateConfig().occupancy),
            (128, 32, 64, False, 2, StateConfig().occupancy),
            (128, 64, 32, False, 2, 4),  # the seed shape's tuned walk: a deeper load pipeline at occupancy 4
            (256, 16, 128, True, 1, StateConfig().occupancy),
        ):
            yield (
                *_hinted(
                    f"fwd_pass_state[{name},Q={chunk},P={tile_p},N={tile_n},init={has_init},step={step}]",
                    fwd_pass_state_kernel,
                    occupancy,
                ),
                _signature(
                    [_array(dtype, 4), _array(dtype, 4), _array(f32, 3), _array(f32, 3)]
                    + [_array(f32, 4), _array(_states(name), 5), _array(f32, 4)]
                    + [8, 8, chunk, tile_p, tile_n, has_init, name == "float32", 4, step]
                ),
            )
    for name, dtype in DTYPES.items():
        default = default_out_config(getattr(torch, name)).occupancy
        for chunk, tile_t, tile_p, tile_n, blocks, occupancy in (
            (64, 64, 64, 64, 1, default),
            (128, 128, 64, 128, 1, default),
            (128, 128, 64, 128, 2, default),
            (128, 64, 64, 64, 2, 4),  # state 64's tuned choice
            (256, 64, 128, 128, 1, default),
        ):
            yield (
                *_hinted(
                    f"compute_out[{name},Q={chunk},T={tile_t},P={tile_p},N={tile_n},blocks={blocks}]",
                    compute_out_kernel,
                    occupancy,
                ),
                _signature(
                    [_array(dtype, 4), _array(dtype, 4), _array(dtype, 4), _array(f32, 3), _array(f32, 3)]
                    + [_array(_states(name), 5), _array(f32, 1), _array(dtype, 4)]
                    + [8, 4, chunk, tile_t, tile_p, tile_n, True, name == "float32", 4, name == "bfloat16", blocks]
                    + [ctc.ScalarConstraint(ct.int32)]
                ),
            )


def backward_signatures() -> Iterator[tuple[str, object, ctc.KernelSignature]]:
    """(label, kernel, signature) for the backward kernels' specializations, at the backward's own chunk size
    (kernels.cutile.ssd.BACKWARD_CHUNK, whatever the forward's), each kernel with its default's hints."""
    f32 = ct.float32
    i32 = ctc.ScalarConstraint(ct.int32)
    chunk = BACKWARD_CHUNK
    # float16 takes the bfloat16 code path but TF32 products with fp32-formed operands (BF16_MMA off);
    # float32 inputs take TF32 products.
    for name, dtype in DTYPES.items():  # stage 1 again, with dA_cumsum·log2(e) for bwd_dx
        label = f"chunk_cumsum[{name},Q={chunk},softplus=True,log2=True]"
        yield label, chunk_cumsum_kernel, _cumsum_signature(dtype, chunk, True, log2=True)
    cases = [("bfloat16", 64, 128, True), ("bfloat16", 128, 64, False), ("float32", 64, 64, False)]
    for name, tile_p, tile_n, flag in cases:
        dtype, tf32 = DTYPES[name], name == "float32"
        dx_hints = default_dx_config(getattr(torch, name))
        yield (
            *_hinted(f"bwd_pass_state[{name},Q={chunk},dfinal={flag}]", bwd_pass_state_kernel, StateConfig().occupancy),
            _signature(
                [_array(dtype, 4), _array(dtype, 4), _array(f32, 3), _array(f32, 4), _array(_states(name), 5)]
                + [_array(f32, 4), 8, 8, chunk, 32, 64, flag, tf32, 4]
            ),
        )
        yield (
            *_hinted(
                f"bwd_dx[{name},Q={chunk},P={tile_p},N={tile_n},D={flag}]",
                bwd_dx_kernel,
                dx_hints.occupancy,
                dx_hints.worker_warps,
            ),
            _signature(
                [_array(dtype, 4)] * 4
                + [_array(f32, 3), _array(f32, 3), _array(_states(name), 5), _array(f32, 1), _array(dtype, 4)]
                + [_array(f32, 3)] * 2
                + [_array(f32, 2), 8, 4, chunk, tile_p, tile_n, flag, tf32, name == "bfloat16", name == "bfloat16"]
                + [dx_hints.chunks, i32]
            ),
        )

    # Both walks in one launch (kernels.cutile.state_walks): the seed's tile (64 x 32, two chunks an iteration) and
    # the default tile in float32, at the default's occupancy
    for name, tile_p, tile_n, step in (("bfloat16", 64, 32, 2), ("float32", 32, 64, 1)):
        dtype, states = DTYPES[name], _array(_states(name), 5)
        yield (
            *_hinted(
                f"state_walks[{name},Q={chunk},P={tile_p},N={tile_n},step={step}]",
                state_walks_kernel,
                StateConfig().occupancy,
            ),
            _signature(
                [_array(dtype, 4), _array(dtype, 4), _array(f32, 3), _array(f32, 3), _array(f32, 4), states]
                + [_array(f32, 4), _array(dtype, 4), _array(dtype, 4), _array(f32, 3), _array(f32, 4), states]
                + [_array(f32, 4), 8, 8, chunk, tile_p, tile_n, False, True, name == "float32", 4, step]
            ),
        )

    # All state columns in one program (DbcConfig's default), at the backward's chunk and at the chunks of 16
    # and 32 that smaller forward chunks give (tileiras 13.4 failed to schedule one form of the kernel there).
    dbc_cases = [(name, chunk, tile_p, tile_n) for name, tile_p, tile_n, _ in cases]
    dbc_cases += [("float32", 16, 64, 64), ("bfloat16", 32, 64, 64)]
    for name, q, tile_p, tile_n in dbc_cases:
        dtype, tf32 = DTYPES[name], name == "float32"
        yield (
            *_hinted(
                f"bwd_dbc[{name},Q={q},P={tile_p},N={tile_n}]",
                bwd_dbc_kernel,
                DbcConfig().occupancy,
                DbcConfig().worker_warps,
            ),
            _signature(
                [_array(dtype, 4)] * 4
                + [_array(f32, 3), _array(f32, 3), _array(_states(name), 5), _array(_states(name), 5), _array(dtype, 4)]
                + [_array(dtype, 4), _array(f32, 4), i32, 2, q, tile_p, tile_n, tf32, name == "bfloat16"]
            ),
        )

    for name, dtype in DTYPES.items():
        for bias, softplus, has_d in ((True, True, True), (False, False, False)):
            yield (
                *_hinted(
                    f"chunk_cumsum_bwd[{name},bias={bias},softplus={softplus},D={has_d}]",
                    chunk_cumsum_bwd_kernel,
                    CumsumBwdConfig().occupancy,
                ),
                _signature(
                    [_array(f32, 3)] * 4
                    + [_array(dtype, 3), _array(f32, 1), _array(f32, 1), _array(f32, 2), _array(dtype, 3)]
                    + [_array(f32, 3), i32, chunk, 8, bias, softplus, has_d]
                ),
            )


def conv_signatures() -> Iterator[tuple[str, object, ctc.KernelSignature]]:
    """(label, kernel, signature) for the causal conv's kernels (kernels/cutile/causal_conv.py): every dtype with
    the default configuration, every tile of the tune spaces at bf16 without a bias (the forward's and the gv
    kernel's at each of their occupancy hints), and k = 3 (the model's is 4). The backward's dx kernel takes the
    forward's tiles without a hint."""
    f32 = ct.float32

    def arrays(stage: str, dtype) -> list:  # x, weight, bias, then y0-2, end0, end1; or dy0-2, gv, dparams_part,
        # steps, end0, end1
        if stage == "conv_bwd_dx":  # gv, weight, dx
            return [_array(dtype, 3), _array(f32, 2), _array(dtype, 3)]
        i32 = ctc.ScalarConstraint(ct.int32)
        outputs = (
            [_array(dtype, 3)] * 3 + [i32] * 2
            if stage == "conv_fwd"
            else [_array(dtype, 3)] * 4 + [_array(f32, 4)] + [i32] * 3
        )
        return [_array(dtype, 3), _array(f32, 2), _array(f32, 1), *outputs]

    for stage, kernel, tiles, default, hints in (  # hints: each tile's occupancy hints
        ("conv_fwd", conv_fwd_kernel, FWD_TILES, DEFAULT_FWD, dict.fromkeys(FWD_TILES, FWD_OCCUPANCY)),
        ("conv_bwd_gv", conv_bwd_gv_kernel, BWD_TILES, DEFAULT_BWD, BWD_OCCUPANCY),
        ("conv_bwd_dx", conv_bwd_dx_kernel, FWD_TILES, DEFAULT_DX, dict.fromkeys(FWD_TILES, (1,))),
    ):
        first, hint = (default.TILE_T, default.TILE_C), default.occupancy
        cases = [(name, 4, first, hint, True) for name in DTYPES]
        cases += [("bfloat16", 4, tile, occupancy, False) for tile in tiles for occupancy in hints[tile]]
        cases.append(("bfloat16", 3, first, hint, True))
        if stage == "conv_bwd_dx":  # no bias: one case per dtype, tile and k
            cases = list(dict.fromkeys((name, k, tile, 1, False) for name, k, tile, _, _ in cases))
        for name, k, (tile_t, tile_c), occupancy, bias in cases:
            constants = [k, tile_t, tile_c] + ([] if stage == "conv_bwd_dx" else [bias])
            label = f"{stage}[{name},K={k},T={tile_t},C={tile_c}" + (
                "]" if stage == "conv_bwd_dx" else f",bias={bias}]"
            )
            yield *_hinted(label, kernel, occupancy), _signature([*arrays(stage, DTYPES[name]), *constants])


def norm_signatures() -> Iterator[tuple[str, object, ctc.KernelSignature]]:
    """(label, kernel, signature) for the gated RMSNorm's kernels (kernels/cutile/rms_norm.py) at the medium
    model's group of 1536 channels: every dtype with the default configuration and a gate, every tile of the tune
    spaces at each occupancy hint at bf16, and no gate."""
    f32 = ct.float32
    group = 1536
    for stage, kernel, default, tiles, hints in (
        ("norm_fwd", norm_fwd_kernel, NORM_FWD, NORM_FWD_TILES, NORM_FWD_OCCUPANCY),
        ("norm_bwd", norm_bwd_kernel, NORM_BWD, NORM_BWD_TILES, NORM_BWD_OCCUPANCY),
    ):
        first = (default.TILE_T, default.TILE_D, default.occupancy)
        cases = [(name, first, True) for name in DTYPES]
        cases += [("bfloat16", (*tile, occ), True) for tile in tiles for occ in hints if (*tile, occ) != first]
        cases.append(("bfloat16", first, False))
        for name, (tile_t, tile_d, occupancy), gate in cases:
            dtype = DTYPES[name]
            if stage == "norm_fwd":  # x, z, weight, out (bf16, as under autocast), rstd, eps
                arrays = [_array(dtype, 2), _array(dtype, 2), _array(f32, 1), _array(ct.bfloat16, 2), _array(f32, 2)]
                arrays.append(ctc.ScalarConstraint(f32))
            else:  # x, z, weight, rstd, dout, dx, dz, dweight_part
                arrays = [_array(dtype, 2), _array(dtype, 2), _array(f32, 1), _array(f32, 2), _array(ct.bfloat16, 2)]
                arrays += [_array(dtype, 2), _array(dtype, 2), _array(f32, 2)]
            label = f"{stage}[{name},G={group},T={tile_t},D={tile_d},gate={gate}]"
            yield *_hinted(label, kernel, occupancy), _signature([*arrays, group, tile_t, tile_d, gate])


def every_signature() -> Iterator[tuple[str, object, ctc.KernelSignature]]:
    """Every specialization CI compiles: the SSD's forward and backward, the causal conv's, the RMSNorm's."""
    yield from signatures()
    yield from backward_signatures()
    yield from conv_signatures()
    yield from norm_signatures()


def export_all(gpu_code: str) -> dict[str, int]:
    """Compile every specialization for `gpu_code` ("sm_90", "sm_100", ...): label -> cubin bytes.

    Raises RuntimeError naming the kernel and specialization that failed to compile.
    """
    sizes = {}
    for label, kernel, sig in every_signature():
        buf = io.BytesIO()
        try:
            ctc.export_kernel(kernel, [sig], buf, gpu_code=gpu_code, output_format="cubin")
        except Exception as e:
            raise RuntimeError(f"cuTile kernel {label} failed to compile for {gpu_code}: {e}") from e
        sizes[label] = len(buf.getvalue())
    return sizes


def main(argv: list[str]) -> int:
    for arch in argv or ["sm_90", "sm_100"]:
        start = time.perf_counter()
        sizes = export_all(arch)
        print(f"{arch}: {len(sizes)} kernels compiled in {time.perf_counter() - start:.1f} s")
        for label, size in sizes.items():
            print(f"  {label}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
