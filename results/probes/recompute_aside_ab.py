"""A/B of the cuTile backward's state recompute on a second stream (kernels.cutile.ssd.RECOMPUTE_ASIDE) against
the same passes all on one stream, in one process, alternating: bench_kernels' cutile:cutile forward + backward at
each shape, GPU time (the union of the kernels' intervals: what the overlap can save) and the kernels' summed
durations (what it costs them to share the GPU), wall clock eager and as one CUDA graph replayed (as the training
step runs it; in eager mode the host launches more slowly than the GPU runs these kernels, so the second stream
seldom has work beside the first), and every gradient compared between the two (the same kernels and
configurations: they must be equal bit for bit).

    python results/probes/recompute_aside_ab.py --shapes seed,step,step_l8192 --autotune
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_kernels  # noqa: E402

from kernels.cutile import ssd, tuning  # noqa: E402
from lightning_modules.measure.timing import gpu_kernel_ms, graph_replay, summarize, wall_ms  # noqa: E402

ARMS = {"one stream": False, "aside": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="seed,step,step_l8192")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--autotune", action="store_true")
    args = ap.parse_args()
    tuning.set_autotune(args.autotune)
    for name in args.shapes.split(","):
        (shape,) = bench_kernels.SHAPE_SETS[name]
        call = bench_kernels.make_call(shape, "cutile:cutile", "fwd_bwd", "cuda")
        grads = {}
        for arm, aside in ARMS.items():
            ssd.RECOMPUTE_ASIDE = aside
            for _ in range(3):
                grads[arm] = call()
        torch.cuda.synchronize()
        same = all(torch.equal(a, b) for a, b in zip(*grads.values()))
        replays = {}
        for arm, aside in ARMS.items():
            ssd.RECOMPUTE_ASIDE = aside
            replays[arm] = graph_replay(call)
        walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
        graph_walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.repeats):
            for arm, aside in ARMS.items():
                ssd.RECOMPUTE_ASIDE = aside
                walls[arm].append(wall_ms(call, args.calls))
                graph_walls[arm].append(wall_ms(replays[arm], args.calls))
        prof = {}
        for arm, aside in ARMS.items():
            ssd.RECOMPUTE_ASIDE = aside
            prof[arm] = gpu_kernel_ms(call, 5)
        print(f"{name} {shape}: gradients equal bit for bit: {same}")
        for arm in ARMS:
            w, gw, p = summarize(walls[arm]), summarize(graph_walls[arm]), prof[arm]
            print(
                f"  {arm:10s} gpu {p['ms']:.4f} ms  kernels summed {p['kernel_sum_ms']:.4f} ms  "
                f"wall {w['median']:.4f} [{w['min']:.4f}-{w['max']:.4f}] ms  "
                f"CUDA graph {gw['median']:.4f} [{gw['min']:.4f}-{gw['max']:.4f}] ms"
            )
            for kernel, ms in list(p["by_kernel"].items())[:10]:
                print(f"      {ms * 1e3:8.1f} us  {kernel[:90]}")
        one, aside = (statistics.median(graph_walls[arm]) for arm in ARMS)
        print(f"  CUDA graph one stream / aside: {one / aside:.3f}x ({(one - aside) * 1e3:.1f} us saved)", flush=True)
        del call, grads, replays
        torch.cuda.empty_cache()
    ssd.RECOMPUTE_ASIDE = True


if __name__ == "__main__":
    main()
