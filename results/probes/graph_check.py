"""Does the SSD's forward + backward replay as a CUDA graph? One variant in one process: capture (graph_replay: after
two warm-up calls on a side stream), replay `--replays` times, then compare the replay's gradients with an eager
call's. Prints one line: OK with the largest relative difference, or the error. Options force the walks' mode and
bwd_dx's chunks a program. With tuning off, choices in the tuning cache are used (cache_path()): pointing
XDG_CACHE_HOME at a cache holding one kernel's entry tries that choice alone
(results/probes/graph_check_2026-12-03.txt).

    python results/probes/graph_check.py --variant cutile:cutile --walks "one launch" --shape seed   # needs a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_kernels  # noqa: E402

from kernels.cutile import state_walks, tuning  # noqa: E402
from kernels.cutile.bwd_dx import DxConfig  # noqa: E402
from kernels.testing import rel_err  # noqa: E402
from lightning_modules.measure.timing import graph_replay  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="cutile:cutile")
    ap.add_argument("--walks", default=state_walks.WALKS)
    ap.add_argument("--dx-chunks", type=int, default=0, help="force bwd_dx's chunks a program (occupancy 2)")
    ap.add_argument("--shape", default="seed")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--autotune", action="store_true")
    args = ap.parse_args()
    tuning.set_autotune(args.autotune)
    state_walks.WALKS = args.walks
    label = (
        f"{args.variant} autotune={args.autotune} walks={args.walks!r} dx_chunks={args.dx_chunks} shape={args.shape}"
    )
    forced = tuning.forced("bwd_dx", DxConfig(2, 0, args.dx_chunks)) if args.dx_chunks else contextlib.nullcontext()
    with forced:
        print(check(args, label), flush=True)


def check(args: argparse.Namespace, label: str) -> str:
    try:
        shape = bench_kernels.SHAPE_SETS[args.shape][0]
        call = bench_kernels.make_call(shape, args.variant, "fwd_bwd", "cuda")
        want = [g.clone() for g in call()]
        outputs = []
        replay = graph_replay(lambda: outputs.append(call()))
        got = outputs[-1]  # the captured call's gradients, which each replay rewrites
        for _ in range(args.replays):
            replay()
        torch.cuda.synchronize()
        diff = max(rel_err(a, b) for a, b in zip(got, want))
        return f"OK   {label}: replays {args.replays}, largest relative difference {diff:.2e}"
    except Exception as e:
        return f"FAIL {label}: {type(e).__name__}: {str(e).splitlines()[0]}"


if __name__ == "__main__":
    main()
