"""Registers, spills, shared memory and SASS counts (sm_90) of the causal conv's gv kernel, production's and that
of results/variants/causal_conv_gv_loop.patch, at each tile of their tune spaces, compiled with the array
constraints the medium model's step launched (32-bit indices, strides divisible by 8, 16-byte bases: the conv_bwd
kernel name below, from results/step_h200_layers_quick.json's profile, encodes them: the arrays the variant
shares with production take its constraints). Needs cuobjdump and nvdisasm
(scripts/kernel_resources.py says how):

    patch kernels/cutile/causal_conv.py -o /tmp/causal_conv_gv_loop.py < results/variants/causal_conv_gv_loop.patch
    PYTHONPATH=. python results/probes/conv_gv_loop_resources.py --cuobjdump PATH /tmp/causal_conv_gv_loop.py
"""

import argparse
import dataclasses

import cuda.tile as ct
from cuda.tile import compilation as ctc

from kernels.cutile import causal_conv
from kernels.cutile.variant import load_variant
from scripts.kernel_resources import resources

LAUNCHED = (
    "conv_bwd_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2f32_1i16v4l0_2t1_p16_A1f32_1i16t1_p16_A3bf16_3v8l0_4t1_6i16_p16"
    "_A3bf16_3v8l0_4t1_6i16_p16_A4f32_6i16_7v4l0_8t1_p16_A3f32_3v4l0_4t1_6i16_p16_I4_I16_I256_B1"
)
C = ctc.ConstantConstraint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("gv_loop", help="causal_conv.py with results/variants/causal_conv_gv_loop.patch applied")
    args = ap.parse_args()
    _, like = ctc.demangle_kernel_name(LAUNCHED)
    p = list(like.parameters)  # x, weight, bias, dy, dx, dweight_part, dbias_part, K, TILE_T, TILE_C, HAS_BIAS

    def show(label: str, kernel, params) -> None:
        sig = ctc.KernelSignature(tuple(params), calling_convention=like.calling_convention)
        print(f"{label:24s} {resources(kernel, sig, 'sm_90', args.cuobjdump, sass=True)}", flush=True)

    for tt, tc in causal_conv.BWD_TILES:
        show(f"production gv {tt}x{tc}", causal_conv.conv_bwd_gv_kernel, [*p[:8], C(tt), C(tc), p[10]])
    variant = load_variant(args.gv_loop)
    steps = ctc.ScalarConstraint(ct.int32)
    # the partial sums, (b, segments, 4, c) and (b, segments, c): production's constraints, but only the 4 taps and
    # c (1792) divisible by 16, the segment count any
    dw_part = dataclasses.replace(p[5], shape_divisible_by=(1, 1, 4, 16))
    db_part = dataclasses.replace(p[6], shape_divisible_by=(1, 1, 16))
    for tt, tc in variant.BWD_TILES:
        params = [*p[:5], dw_part, db_part, steps, p[7], C(tt), C(tc), p[10]]
        show(f"gv loop {tt}x{tc}", variant.conv_bwd_gv_kernel, params)


if __name__ == "__main__":
    main()
