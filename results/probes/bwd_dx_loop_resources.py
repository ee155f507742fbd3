"""Registers, spills and shared memory (sm_90) of bwd_dx builds whose program takes CHUNKS chunks in turn
(kernels/cutile/bwd_dx.py since 942c7ef; first run on the patches results/variants/bwd_dx_chunk_loop.patch and
bwd_dx_chunk_loop_dstates_latency.patch, kept at commit 41807d7), at the seed's launch: the kernel name below (the
one-chunk kernel's, from results/kernels_h200_headline.json's profile at 41807d7) encodes its array constraints, and
the loop's two added parameters (CHUNKS, a constant, and last_chunk, a 32-bit integer) are appended. Each occupancy
hint and chunk count asked for is compiled and read with cuobjdump (scripts/kernel_resources.py says how to get it):
its shared memory shows whether the loop keeps a second buffer of tiles in flight.

    PYTHONPATH=. python results/probes/bwd_dx_loop_resources.py --cuobjdump PATH VARIANT.py [--chunks 1,2,4]
"""

import argparse

import cuda.tile as ct
from cuda.tile import compilation as ctc

from kernels.cutile.launch import with_hints
from kernels.cutile.variant import load_variant
from scripts.kernel_resources import resources

LAUNCHED = (
    "bwd_dx_kernel_Kt2_A4bf16_7v8l0_8t1_ai16_p16_A4bf16_7v8l0_8t1_ai16_p16_A4bf16_4s1_7v8l0_8t1_ai16_p16_A4bf16_4s1_7"
    "v8l0_8t1_ai16_p16_A3f32_3v4l0_4i16t1_p16_A3f32_3v4l0_4i16t1_p16_A5bf16_fv8l0_10t1_1ai16_p16_A1f32_1t1_p16_A4bf16"
    "_7v8l0_8t1_ai16_p16_A3f32_3v4l0_4i16t1_p16_A3f32_3v4l0_4i16t1_p16_A2f32_1v4l0_2i16t1_p16_I8_I8_I64_I64_I128_B1_B"
    "0_B1_B1"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", help="bwd_dx.py with a chunk loop (CHUNKS and last_chunk as its last parameters)")
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--occupancy", default="1,2")
    ap.add_argument("--chunks", default="1,2,4")
    args = ap.parse_args()
    _, signature = ctc.demangle_kernel_name(LAUNCHED)
    last_chunk = ctc.ScalarConstraint(ct.int32)
    kernel = load_variant(args.variant).bwd_dx_kernel
    for occupancy in map(int, args.occupancy.split(",")):
        for chunks in map(int, args.chunks.split(",")):
            params = [*signature.parameters, ctc.ConstantConstraint(chunks), last_chunk]
            built = ctc.KernelSignature(params, signature.calling_convention)
            line = resources(with_hints(kernel, occupancy), built, "sm_90", args.cuobjdump)
            print(f"occupancy {occupancy}, {chunks} chunks: {line}", flush=True)


if __name__ == "__main__":
    main()
