"""A/B of the ways the cuTile backward runs its two state walks (kernels.cutile.state_walks.WALKS): the recompute on
a second stream ("aside"), both walks on one stream ("one stream"), and both in one kernel ("one launch"), in one
process, alternating: bench_kernels' cutile:cutile forward + backward at each shape, GPU time (the union of the
kernels' intervals: what the overlap can save) and the kernels' summed durations (what it costs them to share the
GPU), wall clock eager and as one CUDA graph replayed (as the training step runs it; in eager mode the host launches
more slowly than the GPU runs these kernels, so the second stream seldom has work beside the first), and every
gradient compared with the first arm's: bit for bit where the arms run the same kernels, within TOL where the one
launch's build differs.

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

from kernels.cutile import state_walks, tuning  # noqa: E402
from kernels.testing import rel_err  # noqa: E402
from lightning_modules.measure.timing import gpu_kernel_ms, graph_replay, summarize, wall_ms  # noqa: E402

ARMS = ("one stream", "aside", "one launch")
TOL = 1e-2  # relative, of a gradient against the first arm's, where the kernels differ


def main() -> None:
    default_walks = state_walks.WALKS  # restored at the end
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
        for arm in ARMS:
            state_walks.WALKS = arm
            for _ in range(3):
                grads[arm] = call()
        torch.cuda.synchronize()
        first = grads[ARMS[0]]
        same = {arm: all(torch.equal(a, b) for a, b in zip(first, grads[arm])) for arm in ARMS[1:]}
        close = {arm: max(rel_err(a, b) for a, b in zip(grads[arm], first)) for arm in ARMS[1:]}
        replays = {}
        for arm in ARMS:
            state_walks.WALKS = arm
            replays[arm] = graph_replay(call)
        walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
        graph_walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.repeats):
            for arm in ARMS:
                state_walks.WALKS = arm
                walls[arm].append(wall_ms(call, args.calls))
                graph_walls[arm].append(wall_ms(replays[arm], args.calls))
        prof = {}
        for arm in ARMS:
            state_walks.WALKS = arm
            prof[arm] = gpu_kernel_ms(call, 5)
        print(f"{name} {shape}:")
        for arm in ARMS[1:]:
            verdict = "equal bit for bit" if same[arm] else f"largest relative difference {close[arm]:.1e}"
            ok = same[arm] or close[arm] < TOL
            print(f"  gradients, {arm} against {ARMS[0]}: {verdict}{'' if ok else f' (above {TOL}: WRONG)'}")
        for arm in ARMS:
            w, gw, p = summarize(walls[arm]), summarize(graph_walls[arm]), prof[arm]
            print(
                f"  {arm:10s} gpu {p['ms']:.4f} ms  kernels summed {p['kernel_sum_ms']:.4f} ms  "
                f"wall {w['median']:.4f} [{w['min']:.4f}-{w['max']:.4f}] ms  "
                f"CUDA graph {gw['median']:.4f} [{gw['min']:.4f}-{gw['max']:.4f}] ms"
            )
            for kernel, ms in list(p["by_kernel"].items())[:10]:
                print(f"      {ms * 1e3:8.1f} us  {kernel[:90]}")
        base = statistics.median(graph_walls[ARMS[0]])
        for arm in ARMS[1:]:
            ms = statistics.median(graph_walls[arm])
            print(f"  CUDA graph {ARMS[0]} / {arm}: {base / ms:.3f}x ({(base - ms) * 1e3:.1f} us saved)", flush=True)
        del call, grads, replays
        torch.cuda.empty_cache()
    state_walks.WALKS = default_walks


if __name__ == "__main__":
    main()
