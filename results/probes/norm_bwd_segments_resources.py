"""Registers, spills and shared memory (sm_90) of the norm backward that sums dw over a segment of token tiles in
registers (results/variants/rms_norm_bwd_segments.patch), at each tile and occupancy hint of its tune space, bf16,
gated, the medium model's group of 1536, with the array constraints aot.py compiles (scripts/kernel_resources.py
says how to install cuobjdump):

    patch kernels/cutile/rms_norm.py -o /tmp/rms_norm_bwd_segments.py < results/variants/rms_norm_bwd_segments.patch
    PYTHONPATH=. python results/probes/norm_bwd_segments_resources.py --cuobjdump PATH /tmp/rms_norm_bwd_segments.py
"""

import argparse

import cuda.tile as ct
from cuda.tile import compilation as ctc

from kernels.cutile.aot import _array, _signature
from kernels.cutile.launch import next_pow2, with_hints
from kernels.cutile.variant import load_variant
from scripts.kernel_resources import resources

GROUP = 1536


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variant")
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    module = load_variant(args.variant, until="@torch.library.custom_op")
    bf16, f32 = ct.bfloat16, ct.float32
    for tile_t, tile_d in module.BWD_TILES:
        blocks = next_pow2(GROUP // tile_d, floor=1)
        # x, z, weight, rstd, dout, dx, dz, dweight_part, steps
        arrays = [_array(bf16, 2), _array(bf16, 2), _array(f32, 1), _array(f32, 2), _array(bf16, 2)]
        arrays += [_array(bf16, 2), _array(bf16, 2), _array(f32, 3), ctc.ScalarConstraint(ct.int32)]
        sig = _signature([*arrays, GROUP, tile_t, tile_d, blocks, True])
        for occupancy in module.BWD_OCCUPANCY:
            kernel = with_hints(module.norm_bwd_kernel, occupancy)
            line = resources(kernel, sig, args.arch, args.cuobjdump)
            print(f"norm_bwd {tile_t}x{tile_d} occupancy {occupancy}  {line}", flush=True)


if __name__ == "__main__":
    main()
