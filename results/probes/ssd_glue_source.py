"""Where the SSD's small PyTorch kernels come from: one forward + backward of bench_kernels' call (the cuTile
forward with the cuTile backward unless --variant says otherwise) under torch.profiler, each GPU kernel that is
not a cuTile stage (a reduce, a fill, a multiply, a copy) traced back through its correlation id to the host ops
that launched it, with their input shapes. The step shape's backward is 0.438 ms against Triton's 0.853 (0.514x);
issue 10 asks for half, and these kernels took about 15 us of it (results/kernels_h200_headline.json).

    python results/probes/ssd_glue_source.py --shapes step,seed
    python results/probes/ssd_glue_source.py --shapes step --variant triton --all
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(Path(__file__).resolve().parent)]

import bench_kernels  # noqa: E402
from memcpy_source import host_stacks  # noqa: E402

import kernels  # noqa: E402

CUTILE_STAGE = "_kernel_K"  # a cuTile kernel's launched name: STAGE_kernel_K<constants>_<signature>


def glue_rows(events: list[dict], every: bool) -> dict[tuple, list[float]]:
    """(kernel, launching call, host op stack, shapes) -> each launch's GPU ms, for the kernels that are not
    cuTile stages (all of them with `every`)."""
    stacks = host_stacks(events)
    rows: dict[tuple, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        if not every and CUTILE_STAGE in e["name"]:
            continue
        call, around = stacks.get(e["args"].get("correlation"), ("?", []))
        names = " > ".join(o["name"] for o in around[-5:])
        shapes = str(around[-1]["args"].get("Input Dims", "")) if around else ""
        rows[(e["name"][:90], call, names, shapes)].append(e.get("dur", 0) / 1e3)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="step", help="bench_kernels shape sets, comma-separated (seed, step)")
    ap.add_argument("--variant", default="cutile:cutile", help="a bench_kernels backend (cutile:cutile, triton, ...)")
    ap.add_argument("--all", action="store_true", help="every kernel, the cuTile stages too")
    ap.add_argument("--trace", default="/tmp/ssd_glue_trace.json", help="where the chrome trace is written")
    args = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    kernels.set_autotune(True)  # the tuned configurations, as the benchmark's (bwd_dbc's sum depends on them)
    for name in args.shapes.split(","):
        for shape in bench_kernels.SHAPE_SETS[name]:
            call = bench_kernels.make_call(shape, args.variant, "fwd_bwd", "cuda")
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
                call()
                torch.cuda.synchronize()
            prof.export_chrome_trace(args.trace)
            rows = glue_rows(json.loads(Path(args.trace).read_text())["traceEvents"], args.all)
            total = sum(sum(ms) for ms in rows.values())
            print(f"{args.variant} {name} {shape}: {total * 1e3:.1f} us in {sum(map(len, rows.values()))} launches")
            for (kname, launch, names, shapes), ms in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
                print(
                    f"{sum(ms) * 1e3:8.1f} us x{len(ms):3d}  {kname} via {launch}\n      {names}\n      {shapes[:300]}"
                )
    sys.stdout.flush()
    os._exit(0)  # the profiler's teardown at interpreter exit can crash after the report


if __name__ == "__main__":
    main()
