"""The SSD's forward and forward + backward replayed as CUDA graphs, cuTile (its cuTile backward) beside Triton, in
one process, alternating: the time each takes when the host does not pace it, as in a training step replayed as a
CUDA graph. In eager mode the cuTile forward + backward is host-bound (about 1.8 ms of wall clock against 0.85 ms of
GPU time at the seed shape), so its backward's recompute (on a second stream) overlaps bwd_pass_state only as far as
the host launches them close together (results/probes/stream_timeline_seed_2026-12-03.txt); a replay launches
everything at once. Per shape, mode and backend: the replay's wall time (CUDA events around `--calls` replays back
to back) in each of `--rounds` rounds, median [min-max], and the union of the replay's kernel intervals (GPU time,
torch.profiler over 5 replays), then cuTile's ratio over Triton on each.

    python results/probes/graph_replay.py --shapes seed,step,step_l8192 --autotune      # needs a GPU
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

from kernels.cutile import tuning  # noqa: E402
from lightning_modules.measure.timing import gpu_kernel_ms, graph_replay, wall_ms  # noqa: E402

BACKENDS = {"fwd": ("cutile", "triton"), "fwd_bwd": ("cutile:cutile", "triton")}


def cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):.4f} [{min(samples):.4f}-{max(samples):.4f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="seed,step,step_l8192")
    ap.add_argument("--modes", default="fwd,fwd_bwd")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--autotune", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("graph_replay.py: needs a CUDA GPU")
    tuning.set_autotune(args.autotune)
    for name in args.shapes.split(","):
        for shape in bench_kernels.SHAPE_SETS[name]:
            for mode in args.modes.split(","):
                replays = {b: graph_replay(bench_kernels.make_call(shape, b, mode, "cuda")) for b in BACKENDS[mode]}
                walls: dict[str, list[float]] = {b: [] for b in replays}
                for _ in range(args.rounds):
                    for backend, replay in replays.items():  # alternate: drift hits both alike
                        walls[backend].append(wall_ms(replay, args.calls))
                gpu = {b: gpu_kernel_ms(replay, 5)["ms"] for b, replay in replays.items()}
                cutile, triton = BACKENDS[mode]
                print(f"{name} {shape} {mode}:")
                for backend in replays:
                    print(f"  {backend:14s} replay wall {cell(walls[backend])} ms  GPU {gpu[backend]:.4f} ms")
                wall_ratio = statistics.median(walls[triton]) / statistics.median(walls[cutile])
                print(
                    f"  {cutile} over {triton}: wall {wall_ratio:.3f}x, GPU {gpu[triton] / gpu[cutile]:.3f}x",
                    flush=True,
                )
                del replays
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
