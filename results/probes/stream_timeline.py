"""Where a forward + backward call's GPU time goes between its streams: one call of bench_kernels' (the cuTile forward
with the cuTile backward unless --variant says otherwise) under torch.profiler, each kernel printed in start order
with its stream, start and end (us from the call's first kernel), and then, for every pair of kernels on different
streams that ran at once, how long they overlapped; last the call's union of GPU time against its kernels' sum.

The cuTile backward recomputes the chunk states (chunk_cumsum and fwd_pass_state at chunk 64) on a second stream
beside bwd_pass_state. On 09afe91's code those two walks took 35 us less than on 2e865d9's, yet the seed's forward +
backward did not get faster (0.860 against 0.851 ms, results/tuning_log.md, "products from zero"): this shows how
much of the recompute still runs beside bwd_pass_state, and what waits on what.

    python results/probes/stream_timeline.py --shapes seed            # needs a GPU
    python results/probes/stream_timeline.py --shapes seed,step_l8192 --calls 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from lightning_modules.measure.kernel_names import short_name  # noqa: E402
from lightning_modules.measure.timing import busy_us  # noqa: E402

Span = tuple[str, int, float, float]  # (kernel, stream, start us, end us)


def stream(event: dict) -> int:
    """A kernel event's stream: kineto writes it in args.stream, and as the event's tid."""
    value = event.get("args", {}).get("stream", event.get("tid", 0))
    return int(str(value).split()[-1])


def kernel_spans(events: list[dict]) -> list[Span]:
    """The GPU kernels of a chrome trace's events as (short name, stream, start, end), in start order, times in us
    from the first kernel's start."""
    spans = [
        (short_name(e["name"]), stream(e), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "kernel"
    ]
    if not spans:
        return []
    t0 = min(s[2] for s in spans)
    return sorted(((n, st, a - t0, b - t0) for n, st, a, b in spans), key=lambda s: s[2])


def overlaps(spans: list[Span]) -> list[tuple[str, str, float]]:
    """(kernel, kernel, us) for each pair of kernels on different streams whose intervals meet, longest first."""
    out = []
    for i, (na, sa, a0, a1) in enumerate(spans):
        for nb, sb, b0, b1 in spans[i + 1 :]:
            if sa != sb and min(a1, b1) > max(a0, b0):
                out.append((na, nb, min(a1, b1) - max(a0, b0)))
    return sorted(out, key=lambda o: -o[2])


def report(calls: list[list[Span]]) -> str:
    """The timeline of the median call (by union of GPU time), its overlaps, and every call's union and sum."""
    unions = [busy_us([(a, b) for _, _, a, b in spans]) for spans in calls]
    sums = [sum(b - a for _, _, a, b in spans) for spans in calls]
    median = sorted(range(len(calls)), key=lambda i: unions[i])[len(calls) // 2]
    lines = [f"{'kernel':40s} {'stream':>6s} {'start':>8s} {'end':>8s} {'us':>7s}"]
    lines += [f"{n[:40]:40s} {st:6d} {a:8.1f} {b:8.1f} {b - a:7.1f}" for n, st, a, b in calls[median]]
    lines.append("overlaps on different streams (us):")
    lines += [f"  {a[:36]:36s} with {b[:36]:36s} {us:7.1f}" for a, b, us in overlaps(calls[median])]
    lines.append(
        f"union of GPU time {statistics.median(unions):.1f} us (calls: {', '.join(f'{u:.1f}' for u in unions)}); "
        f"kernels' sum {statistics.median(sums):.1f} us; run at once {statistics.median(sums) - statistics.median(unions):.1f}"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="seed", help="bench_kernels shape sets, comma-separated")
    ap.add_argument("--variant", default="cutile:cutile", help="a bench_kernels backend")
    ap.add_argument("--calls", type=int, default=3, help="profiled calls; the median one's timeline is printed")
    ap.add_argument("--trace", default="/tmp/stream_timeline.json", help="where each call's chrome trace is written")
    args = ap.parse_args()
    import bench_kernels
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kernels

    kernels.set_autotune(True)  # the tuned configurations, as the benchmark's
    for name in args.shapes.split(","):
        for shape in bench_kernels.SHAPE_SETS[name]:
            call = bench_kernels.make_call(shape, args.variant, "fwd_bwd", "cuda")
            for _ in range(3):
                call()
            calls = []
            for _ in range(args.calls):
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    call()
                    torch.cuda.synchronize()
                prof.export_chrome_trace(args.trace)
                calls.append(kernel_spans(json.loads(Path(args.trace).read_text())["traceEvents"]))
            print(f"\n{args.variant} {name} {shape}, {args.calls} calls:\n{report(calls)}", flush=True)
    os._exit(0)  # the profiler's teardown at interpreter exit can crash after the report


if __name__ == "__main__":
    main()
