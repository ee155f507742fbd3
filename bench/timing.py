"""Timing GPU work for the benchmarks, two clocks, always both:

  wall  CUDA events around each call, launch gaps included (what a training loop waits for);
  gpu   the time the GPU spends running the call's kernels, from torch.profiler: the union of their intervals,
        so kernels running at once on two streams count once (on one stream it is the sum of their durations).
The Triton SSD is host-bound below ~8k tokens on the H200, so the two can differ several-fold.
Off a GPU, wall is the host clock and gpu is nan.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def summarize(samples: list[float]) -> dict[str, float]:
    """Median and spread (min, max, interquartile range) of a list of timings."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "iqr": q[2] - q[0], "n": len(s)}


def wall_ms(fn: Callable[[], Any], calls: int) -> float:
    """Mean milliseconds per call of `calls` back-to-back calls, CUDA events around the batch."""
    if not torch.cuda.is_available():
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) * 1e3 / calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def graph_replay(call: Callable[[], Any]) -> Callable[[], None]:
    """`call` captured in a CUDA graph, after two warm-up calls on a side stream (as torch.cuda.graphs asks); returns
    the graph's replay. A replay launches every kernel at once from the host, so its time is the GPU's alone: what a
    training step replayed as a CUDA graph sees of `call`. The replay holds `call` alive: the graph reads and writes
    the tensors `call` holds, and were they freed, a later capture's `torch.cuda.graph` (which empties the allocator's
    cache) could unmap their memory under the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()

    def replay(_holds: Callable[[], Any] = call) -> None:
        graph.replay()

    return replay


def busy_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: time during which at least one of them runs."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def idle_us(spans: list[tuple[float, float]]) -> float:
    """Between the first interval's start and the last one's end, the time during which none of them runs."""
    if not spans:
        return 0.0
    return max(end for _, end in spans) - min(start for start, _ in spans) - busy_us(spans)


def idle_by_pair(kernels: list[tuple[float, float, str]]) -> dict[tuple[str, str], float]:
    """The idle time of idle_us split by where it falls: each gap in which none of the (start, end, name) intervals
    runs, summed by (the name of the interval that ran last before it, the name of the one that starts it)."""
    gaps: dict[tuple[str, str], float] = {}
    reached, last = None, ""
    for start, end, name in sorted(kernels):
        if reached is not None and start > reached:
            gaps[last, name] = gaps.get((last, name), 0.0) + start - reached
        if reached is None or end > reached:
            reached, last = end, name
    return gaps


def gpu_kernel_ms(fn: Callable[[], Any], calls: int) -> dict[str, Any]:
    """GPU time per call from torch.profiler: {"ms" (the GPU busy with the call's kernels, overlaps counted once),
    "idle_ms" (from the first kernel's start to the last one's end, the time no kernel ran: gaps between kernels and
    between calls), "kernel_sum_ms" (their durations summed), "kernels" (launches per call), "by_kernel",
    "launches", "idle_by_pair"}.

    by_kernel maps each kernel name to its milliseconds per call, largest first; launches maps it to its
    launches per call; idle_by_pair maps (kernel before, kernel after) to the idle milliseconds per call between
    them (idle_ms, split by `idle_by_pair`), largest first. Off GPU: ms is nan.
    """
    if not torch.cuda.is_available():
        nan = float("nan")
        empty: dict = {"by_kernel": {}, "launches": {}, "idle_by_pair": {}}
        return {"ms": nan, "idle_ms": nan, "kernel_sum_ms": nan, "kernels": 0, **empty}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    by_kernel: dict[str, float] = {}
    launches: dict[str, int] = {}
    spans: list[tuple[float, float, str]] = []
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA and not evt.is_user_annotation:
            by_kernel[evt.name] = by_kernel.get(evt.name, 0.0) + evt.device_time / 1e3 / calls
            launches[evt.name] = launches.get(evt.name, 0) + 1
            spans.append((evt.time_range.start, evt.time_range.end, evt.name))
    ranked = dict(sorted(by_kernel.items(), key=lambda kv: -kv[1]))
    per_call = {name: launches[name] / max(calls, 1) for name in ranked}
    intervals = [(start, end) for start, end, _ in spans]
    idle = sorted(idle_by_pair(spans).items(), key=lambda kv: -kv[1])
    return {
        "ms": busy_us(intervals) / 1e3 / calls,
        "idle_ms": idle_us(intervals) / 1e3 / calls,
        "kernel_sum_ms": sum(ranked.values()),
        "kernels": round(sum(per_call.values())),
        "by_kernel": ranked,
        "launches": per_call,
        "idle_by_pair": {pair: us / 1e3 / calls for pair, us in idle},
    }


def ceilings() -> dict[str, float]:
    """Measured device-to-device copy bandwidth (GB/s, read + write) and bf16 matmul rate (TFLOP/s)."""
    if not torch.cuda.is_available():
        return {}
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = min(wall_ms(lambda: dst.copy_(src), 10) for _ in range(3))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = min(wall_ms(lambda: a @ b, 10) for _ in range(3))
    return {"copy_GBps": 2 * n / ms / 1e6, "bf16_matmul_TFLOPs": 2 * 8192**3 / mm / 1e9}
