"""The cuTile backward's two state walks in one launch (kernels.cutile.state_walks) under a few configurations, at the
seed shape and the two training-step layers (bench_kernels' SEED, STEP, STEP_L8192), in one process: the untuned
default StateConfig() beside the configurations tuning chose at those shapes. GPU time per call from torch.profiler,
the median of --rounds rounds of --calls calls, configurations alternating within a round.

    python results/probes/walk_defaults.py [--rounds 3 --calls 10]      # on a GPU
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_kernels  # noqa: E402

from kernels.cutile import state_walks, tuning  # noqa: E402
from kernels.cutile.chunk_cumsum import chunk_cumsum  # noqa: E402
from kernels.cutile.fwd_pass_state import StateConfig  # noqa: E402
from kernels.cutile.ssd import BACKWARD_CHUNK  # noqa: E402
from lightning_modules.measure.timing import gpu_kernel_ms, summarize  # noqa: E402

CONFIGS = {
    "StateConfig() (default)": StateConfig(),
    "64x32 occ 2, two chunks (seed's tuned)": StateConfig(64, 32, 4, 2, 2),
    "64x32 occ 4, two chunks (L 8192's tuned)": StateConfig(64, 32, 4, 4, 2),
    "32x128 occ 4, one chunk (L 2048's tuned)": StateConfig(32, 128, 4, 4, 1),
}
SHAPES = {"seed": bench_kernels.SEED, "step L 2048": bench_kernels.STEP, "step L 8192": bench_kernels.STEP_L8192}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    for shape_name, shape in SHAPES.items():
        t = bench_kernels.make_inputs(shape, "cuda", requires_grad=False)
        dt_out, dA = chunk_cumsum(t["dt"], t["A"], BACKWARD_CHUNK, t["dt_bias"], True)
        dy = torch.randn_like(t["x"])

        walks = functools.partial(state_walks.state_walks, t["x"], t["B"], dt_out, dA, None, dy, t["C"], None)

        times: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for _ in range(args.rounds):
            for name, cfg in CONFIGS.items():
                with tuning.forced("state_walks", cfg):
                    walks()  # compile, warm
                    times[name].append(gpu_kernel_ms(walks, args.calls)["ms"] * 1e3)
        print(
            f"{shape_name} (b {shape.batch}, L {shape.seqlen}, h {shape.nheads}), chunk {BACKWARD_CHUNK}:", flush=True
        )
        for name, us in times.items():
            st = summarize(us)
            print(f"    {st['median']:7.1f} us [{st['min']:.1f}-{st['max']:.1f}]  {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
