"""compute_out launched as a programmatic dependent of fwd_pass_state (PDL) against after it: the cuTile forward
(and forward + cuTile backward) at the given shapes, tuned, the two launch modes alternating in one process
(kernels.cutile.launch.DEPENDENT_LAUNCH). Per round and mode: the call's union of GPU time (torch.profiler, 20
calls) and its wall time (CUDA events, 50 calls back to back); medians and min-max over the rounds, and whether
both modes give the same output bit for bit.

Production launches every stage after the one before it: PDL gained nothing here
(results/probes/forward_pdl_2026-12-03.txt). The probe needs the launch mode back, from its patch:

    git apply results/variants/compute_out_dependent_launch.patch
    python results/probes/forward_pdl.py --shapes seed,seed_n64,step,step_l8192 --rounds 5   # needs a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_kernels  # noqa: E402

import kernels  # noqa: E402
from kernels.cutile import launch  # noqa: E402
from lightning_modules.measure.timing import gpu_kernel_ms, wall_ms  # noqa: E402

SHAPES = dict(bench_kernels.SHAPE_SETS) | {"seed_n64": [replace(bench_kernels.SEED, dstate=64)]}
MODES = {"fwd": "cutile", "fwd_bwd": "cutile:cutile"}


def outputs(fn) -> list[torch.Tensor]:
    out = fn()
    return [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="seed,seed_n64,step,step_l8192")
    ap.add_argument("--modes", default="fwd,fwd_bwd")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not hasattr(launch, "DEPENDENT_LAUNCH"):
        sys.exit("forward_pdl.py: apply results/variants/compute_out_dependent_launch.patch first (git apply)")
    kernels.set_autotune(True)
    for shape in [s for name in args.shapes.split(",") for s in SHAPES[name]]:
        for mode in args.modes.split(","):
            fn = bench_kernels.make_call(shape, MODES[mode], mode, "cuda")
            results = {}
            for pdl in (False, True):
                launch.DEPENDENT_LAUNCH = pdl
                for _ in range(3):
                    results[pdl] = outputs(fn)
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(results[False], results[True], strict=True))
            gpu, wall = {False: [], True: []}, {False: [], True: []}
            for _ in range(args.rounds):
                for pdl in (False, True):
                    launch.DEPENDENT_LAUNCH = pdl
                    gpu[pdl].append(gpu_kernel_ms(fn, 20)["ms"] * 1e3)
                    wall[pdl].append(wall_ms(fn, 50) * 1e3)

            def cell(v: list[float]) -> str:
                return f"{statistics.median(v):8.1f} [{min(v):.1f}-{max(v):.1f}]"

            print(
                f"b{shape.batch} L{shape.seqlen} h{shape.nheads} p{shape.headdim} n{shape.dstate} {mode:7s} "
                f"GPU us serial {cell(gpu[False])} pdl {cell(gpu[True])} "
                f"ratio {statistics.median(gpu[False]) / statistics.median(gpu[True]):.3f} | "
                f"wall us serial {cell(wall[False])} pdl {cell(wall[True])} "
                f"ratio {statistics.median(wall[False]) / statistics.median(wall[True]):.3f} | same output {same}",
                flush=True,
            )
    launch.DEPENDENT_LAUNCH = True


if __name__ == "__main__":
    main()
