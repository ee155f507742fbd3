"""Registers, spills and shared memory (sm_90) of the layer-kernel variants in results/variants/, compiled with the
array constraints the medium model's step launched (strides divisible by 8, 16-byte bases, 32-bit indices: the
mangled names below come from results/step_h200_layers_quick.json's profile), at every tile their tune spaces
hold or left out. Needs cuobjdump (scripts/kernel_resources.py says how). The two-pass conv and the occupancy
hints have since been adopted, so the patches apply to the kernel files as they were at commit fd372e6:

    git show fd372e6:kernels/cutile/causal_conv.py > /tmp/causal_conv_fd372e6.py
    git show fd372e6:kernels/cutile/rms_norm.py > /tmp/rms_norm_fd372e6.py
    patch /tmp/causal_conv_fd372e6.py -o /tmp/causal_conv_two_pass.py < results/variants/causal_conv_two_pass.patch
    patch /tmp/rms_norm_fd372e6.py -o /tmp/rms_norm_one_pass.py < results/variants/rms_norm_one_pass.patch
    PYTHONPATH=. python results/probes/variant_resources.py --cuobjdump PATH /tmp/causal_conv_two_pass.py \
        /tmp/rms_norm_one_pass.py

The occupancy variant (rms_norm_occupancy.patch) only adds hints: the production norm kernels at each tile and
occupancy are printed too.
"""

import argparse

import cuda.tile as ct
from cuda.tile import compilation as ctc

from kernels.cutile import aot, rms_norm
from kernels.cutile.variant import load_variant
from scripts.kernel_resources import resources

CONV_BWD = (
    "conv_bwd_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2f32_1i16v4l0_2t1_p16_A1f32_1i16t1_p16_A3bf16_3v8l0_4t1_6i16_p16"
    "_A3bf16_3v8l0_4t1_6i16_p16_A4f32_6i16_7v4l0_8t1_p16_A3f32_3v4l0_4t1_6i16_p16_I4_I16_I256_B1"
)
NORM_FWD = (
    "norm_fwd_kernel_Kt2_A2bf16_1v8l0_2t1_3i16_p16_A2bf16_1v8l0_2t1_3i16_p16_A1f32_1i16t1_p16_A2bf16_1v8l0_2t1_3i16_p16"
    "_A2f32_1i16_2s1_3t1_p16_Sf32_I1536_I8_I256_B1"
)
NORM_BWD = (
    "norm_bwd_kernel_Kt2_A2bf16_1v8l0_2t1_3i16_p16_A2bf16_1v8l0_2t1_3i16_p16_A1f32_1i16t1_p16_A2f32_1i16_2s1_3t1_p16"
    "_A2bf16_1v8l0_2t1_3i16_p16_A2bf16_1v8l0_2t1_3i16_p16_A2bf16_1v8l0_2t1_3i16_p16_A2f32_1v4l0_2t1_3i16_p16"
    "_I1536_I32_I128_B1"
)
C = ctc.ConstantConstraint


def signature(params, like: ctc.KernelSignature) -> ctc.KernelSignature:
    return ctc.KernelSignature(tuple(params), calling_convention=like.calling_convention)


def array(dtype, ndim: int, divisible: tuple[int, ...]) -> ctc.ArrayConstraint:
    """An array as the step launched them: 32-bit indices, last stride 1, the others divisible by `divisible`,
    16-byte base."""
    return aot._array(dtype, ndim, ct.int32, divisible, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("conv_two_pass")
    ap.add_argument("norm_one_pass")
    args = ap.parse_args()

    def show(label: str, kernel, sig) -> None:
        print(f"{label:44s} {resources(kernel, sig, 'sm_90', args.cuobjdump)}", flush=True)

    conv = load_variant(args.conv_two_pass)
    _, bwd = ctc.demangle_kernel_name(CONV_BWD)
    p = list(bwd.parameters)  # x, weight, bias, dy, dx, dweight_part, dbias_part, K, TILE_T, TILE_C, HAS_BIAS
    for tt, tc in ((16, 64), (16, 128), (16, 256), (32, 64), (32, 128), (64, 64), (64, 128)):
        show(f"conv two-pass gv {tt}x{tc}", conv.conv_bwd_gv_kernel, signature([*p[:8], C(tt), C(tc), p[10]], bwd))
        show(
            f"conv two-pass dx {tt}x{tc}",
            conv.conv_bwd_dx_kernel,
            signature([p[0], p[1], p[4], p[7], C(tt), C(tc)], bwd),
        )

    for name, kernel, tiles in (
        (NORM_FWD, rms_norm.norm_fwd_kernel, rms_norm.FWD_TILES),
        (NORM_BWD, rms_norm.norm_bwd_kernel, rms_norm.BWD_TILES),
    ):
        _, sig = ctc.demangle_kernel_name(name)
        p = list(sig.parameters)
        for tt, td in tiles:
            for occ in (1, 2, 4):
                label = f"norm {name[5:8]} {tt}x{td} occupancy {occ}"
                show(label, kernel.replace_hints(occupancy=occ), signature([*p[:-3], C(tt), C(td), p[-1]], sig))

    norm = load_variant(args.norm_one_pass)
    bf, f32 = ct.bfloat16, ct.float32
    _, like = ctc.demangle_kernel_name(NORM_FWD)
    group, width = 1536, 2048
    for tt in (1, 2, 4):
        fwd = [
            array(bf, 3, (8, 8)),
            array(bf, 3, (8, 8)),
            array(f32, 2, (4,)),
            array(bf, 3, (8, 8)),
            array(f32, 2, (1,)),
        ]
        fwd += [ctc.ScalarConstraint(f32), C(group), C(tt), C(width), C(True)]
        bwd = [array(bf, 3, (8, 8)), array(bf, 3, (8, 8)), array(f32, 2, (4,)), array(f32, 2, (1,))]
        bwd += [array(bf, 3, (8, 8))] * 3 + [array(f32, 3, (4, 4)), C(group), C(tt), C(width)]
        bwd += [ctc.ScalarConstraint(ct.int32), C(True)]
        for occ in (1, 2, 4):
            show(
                f"norm one-pass fwd {tt}x{width} occupancy {occ}",
                norm.norm_fwd_kernel.replace_hints(occupancy=occ),
                signature(fwd, like),
            )
            show(
                f"norm one-pass bwd {tt}x{width} occupancy {occ}",
                norm.norm_bwd_kernel.replace_hints(occupancy=occ),
                signature(bwd, like),
            )


if __name__ == "__main__":
    main()
