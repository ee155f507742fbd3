"""Where a step's device-to-device copies come from: one training step of a bench_step variant under
torch.profiler (CPU and CUDA), each copy-like GPU activity (a name holding "memcpy" or "Memcpy") traced back
through its correlation id to the host call that launched it (cudaGraphLaunch: inside a CUDA graph replay;
cudaMemcpyAsync or a kernel launch: eager) and to the innermost profiled host ops around that call, with their
input shapes. Prints one line per (activity, launching call, host op stack, shapes) with its count and GPU time.

    python results/probes/memcpy_source.py --backend standin+conv+norm --compile_mode reduce-overhead
    python results/probes/memcpy_source.py --backend standin+conv+norm --compile_mode default --trace /tmp/t.json
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
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_step  # noqa: E402

import kernels  # noqa: E402
from lightning_modules.measure.step import TimedStep, token_batches  # noqa: E402
from lightning_modules.model.mamba2 import next_token_loss  # noqa: E402


def host_stacks(events: list[dict]) -> dict[int, tuple[str, list[dict]]]:
    """correlation id -> (launching runtime call's name, the cpu_op events enclosing it, outermost first)."""
    ops_by_tid: dict[object, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops_by_tid[e["tid"]].append(e)
    found = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            ts = e["ts"]
            around = [o for o in ops_by_tid[e["tid"]] if o["ts"] <= ts <= o["ts"] + o.get("dur", 0)]
            around.sort(key=lambda o: (o["ts"], -o.get("dur", 0)))
            found[e["args"]["correlation"]] = (e["name"], around)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="medium")
    ap.add_argument("--backend", default="standin+conv+norm", help="a bench_step variant label")
    ap.add_argument("--compile_mode", default="reduce-overhead", help="default, reduce-overhead, ...")
    ap.add_argument("--trace", default=None, help="also keep the chrome trace here")
    args = ap.parse_args()
    mode = None if args.compile_mode == "default" else args.compile_mode
    module = bench_step.load_module(args.config, args.backend, 2048, True, mode).to("cuda")
    step = TimedStep(
        lambda t, m=module.model: next_token_loss(m, t), list(module.parameters()), module.optimizer(fused=True), "cuda"
    )
    kernels.set_autotune(False)
    batches = token_batches(module.config.vocab_size, 8, 2048, 0, "cuda")
    for i in range(4):
        step(batches[i % len(batches)], timed=False)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        step(batches[0], timed=False)
        torch.cuda.synchronize()
    path = Path(args.trace or "/tmp/memcpy_source_trace.json")
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    stacks = host_stacks(events)
    rows: dict[tuple, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy") and "memcpy" in e["name"].lower():
            call, around = stacks.get(e["args"].get("correlation"), ("?", []))
            names = " > ".join(o["name"] for o in around[-4:])
            shapes = str(around[-1]["args"].get("Input Dims", "")) if around else ""
            rows[(e["name"], e["cat"], call, names, shapes)].append(e.get("dur", 0) / 1e3)
    print(f"{args.backend} compile_mode {args.compile_mode}: device-to-device copies of one step")
    for (name, cat, call, names, shapes), ms in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(ms):7.3f} ms x{len(ms):4d}  {name} [{cat}] via {call}\n      {names}\n      {shapes[:300]}")
    sys.stdout.flush()
    os._exit(0)  # the profiler's and the CUDA graphs' teardown at interpreter exit can crash after the report


if __name__ == "__main__":
    main()
