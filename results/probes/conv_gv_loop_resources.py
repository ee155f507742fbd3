"""Registers, spills, shared memory and SASS counts (sm_90) of the causal conv's gv kernel that sums over a segment
of token tiles (production since commit 3c94987; before it, results/variants/causal_conv_gv_loop.patch), at each
tile of its tune space and each occupancy hint asked for, compiled with the array constraints the medium model's
step launched (32-bit indices, strides divisible by 8, 16-byte bases: the conv_bwd kernel name below, from
results/step_h200_layers_quick.json's profile, encodes them; the partial sums take them too, with their own shape
divisors). With `--stage fwd` or `--stage dx`, the forward or dx kernel of a variant that walks token tiles the same
way (results/variants/causal_conv_fwd_dx_loop.patch), at that kernel's launched constraints. Needs cuobjdump and
nvdisasm (scripts/kernel_resources.py says how):

    PYTHONPATH=. python results/probes/conv_gv_loop_resources.py --cuobjdump PATH                # production
    PYTHONPATH=. python results/probes/conv_gv_loop_resources.py --cuobjdump PATH --occupancy 1,2,3,4 VARIANT.py
    PYTHONPATH=. python results/probes/conv_gv_loop_resources.py --cuobjdump PATH --stage fwd --occupancy 1,2,4 VARIANT.py
    PYTHONPATH=. python results/probes/conv_gv_loop_resources.py --cuobjdump PATH --stage dx --occupancy 1,2,4 VARIANT.py

Its output of 2026-12-01 (conv_gv_loop_resources_2026-12-01.txt) came from the script's first form, which also
built the one-pass gv kernel production had then.
"""

import argparse
import dataclasses

import cuda.tile as ct
from cuda.tile import compilation as ctc

from kernels.cutile import causal_conv
from kernels.cutile.launch import with_hints
from kernels.cutile.variant import load_variant
from scripts.kernel_resources import resources

LAUNCHED = (
    "conv_bwd_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2f32_1i16v4l0_2t1_p16_A1f32_1i16t1_p16_A3bf16_3v8l0_4t1_6i16_p16"
    "_A3bf16_3v8l0_4t1_6i16_p16_A4f32_6i16_7v4l0_8t1_p16_A3f32_3v4l0_4t1_6i16_p16_I4_I16_I256_B1"
)
LAUNCHED_FWD = (  # results/step_h200_layers_graphs_profile_quick.json's profile
    "conv_fwd_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2f32_1i16v4l0_2t1_p16_A1f32_1i16t1_p16_A3bf16_3v8l0_4t1_6i16_p16"
    "_I4_I16_I128_B1"
)
LAUNCHED_DX = (  # the same profile
    "conv_bwd_dx_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2f32_1i16v4l0_2t1_p16_A3bf16_3v8l0_4t1_6i16_p16_I4_I16_I128"
)


def gv_signature(tile_t: int, tile_c: int) -> ctc.KernelSignature:
    """The gv kernel's signature at a tile: x, weight, bias, dy and gv take the launched kernel's constraints; the
    partial sums, (b, segments, 4, c) and (b, segments, c), those too, but only the 4 taps and c (1792) divisible by
    16, the segment count any; `steps` a runtime int32; k 4, with a bias."""
    _, like = ctc.demangle_kernel_name(LAUNCHED)
    p = list(like.parameters)  # x, weight, bias, dy, dx, dweight_part, dbias_part, K, TILE_T, TILE_C, HAS_BIAS
    dw_part = dataclasses.replace(p[5], shape_divisible_by=(1, 1, 4, 16))
    db_part = dataclasses.replace(p[6], shape_divisible_by=(1, 1, 16))
    constants = [ctc.ConstantConstraint(tile_t), ctc.ConstantConstraint(tile_c)]
    params = [*p[:5], dw_part, db_part, ctc.ScalarConstraint(ct.int32), p[7], *constants, p[10]]
    return ctc.KernelSignature(tuple(params), calling_convention=like.calling_convention)


def fwd_signature(tile_t: int, tile_c: int) -> ctc.KernelSignature:
    """The token-walking forward's signature at a tile: x, weight, bias and y as launched, `steps` a runtime int32,
    k 4, with a bias."""
    _, like = ctc.demangle_kernel_name(LAUNCHED_FWD)
    p = list(like.parameters)  # x, weight, bias, y, K, TILE_T, TILE_C, HAS_BIAS
    constants = [ctc.ConstantConstraint(tile_t), ctc.ConstantConstraint(tile_c)]
    params = [*p[:4], ctc.ScalarConstraint(ct.int32), p[4], *constants, p[7]]
    return ctc.KernelSignature(tuple(params), calling_convention=like.calling_convention)


def dx_signature(tile_t: int, tile_c: int) -> ctc.KernelSignature:
    """The token-walking dx kernel's signature at a tile: gv, weight and dx as launched, `steps` a runtime int32, k 4."""
    _, like = ctc.demangle_kernel_name(LAUNCHED_DX)
    p = list(like.parameters)  # gv, weight, dx, K, TILE_T, TILE_C
    constants = [ctc.ConstantConstraint(tile_t), ctc.ConstantConstraint(tile_c)]
    params = [*p[:3], ctc.ScalarConstraint(ct.int32), p[3], *constants]
    return ctc.KernelSignature(tuple(params), calling_convention=like.calling_convention)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--occupancy", default="", help="occupancy hints, comma-separated (default: none)")
    ap.add_argument("--stage", choices=("gv", "fwd", "dx"), default="gv", help="fwd, dx: a token-walking variant's")
    ap.add_argument("variant", nargs="?", help="a changed copy of kernels/cutile/causal_conv.py (default: production)")
    args = ap.parse_args()
    module = load_variant(args.variant) if args.variant else causal_conv
    hints = [int(h) for h in args.occupancy.split(",") if h] or [None]
    kernel, tiles, signature = {
        "gv": (module.conv_bwd_gv_kernel, module.BWD_TILES, gv_signature),
        "fwd": (module.conv_fwd_kernel, module.FWD_TILES, fwd_signature),
        "dx": (module.conv_bwd_dx_kernel, module.FWD_TILES, dx_signature),
    }[args.stage]
    for tt, tc in tiles:
        for occupancy in hints:
            hinted = kernel if occupancy is None else with_hints(kernel, occupancy)
            found = resources(hinted, signature(tt, tc), "sm_90", args.cuobjdump, sass=True)
            print(f"{args.stage} {tt}x{tc} occupancy {occupancy or '-'}  {found}", flush=True)


if __name__ == "__main__":
    main()
