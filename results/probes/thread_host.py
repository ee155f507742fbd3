"""Why the cuTile backward body takes more host time on autograd's device thread than on the calling thread (0.998
against 0.730 ms at the seed shape: results/probes/eager_paths_2026-12-02b.txt). Each part of the body's host path
is timed on three threads: the main thread, a new Python thread (threading.Thread), and autograd's device thread
(inside an autograd.Function's backward). Parts, at the seed shape:

    empty           torch.empty of the backward's largest buffer (dx's shape, bf16)
    current_stream  torch.cuda.current_stream(device)
    raw_stream      torch._C._cuda_getCurrentRawStream(index): the same stream as a plain int, no Stream object
    device_guard    entering and leaving `with torch.cuda.device(device)`
    launch          one ct.launch of chunk_cumsum_bwd with arguments recorded from a real call (a small grid)
    launch_raw      the same launch given the raw stream handle (cuTile accepts an int): what launch would save
    stage           one host call of a stage as the backward makes it (chunk_cumsum, launch path included)
    body            the cuTile backward body, kernels.cutile.ssd.ssd_gradients

Host microseconds per call: the median over 5 rounds of `--calls` back-to-back calls enqueued behind a GPU sleep
(so no call waits for the GPU). A part slower on both other threads than on the main thread points at per-thread
state; slower on autograd's thread only, at what the engine sets around a backward (its stream and device guards).

    python results/probes/thread_host.py [--calls 50]      # on a GPU, after scripts/precompile.py --shapes seed
    python results/probes/thread_host.py --untuned          # the default configurations: nothing to tune
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import cuda.tile as ct
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_kernels  # noqa: E402
from eager_paths import enqueue_ms  # noqa: E402

import kernels  # noqa: E402
from kernels.cutile import ssd as cs  # noqa: E402


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Median over 5 rounds of eager_paths.enqueue_ms (`calls` calls enqueued behind a GPU sleep), in microseconds."""
    return statistics.median(enqueue_ms(fn, calls) for _ in range(5)) * 1e3


def on_main(fn: Callable[[], object], calls: int) -> float:
    return host_us(fn, calls)


def on_thread(fn: Callable[[], object], calls: int) -> float:
    result = []
    worker = threading.Thread(target=lambda: result.append(host_us(fn, calls)))
    worker.start()
    worker.join()
    return result[0]


def on_autograd_thread(fn: Callable[[], object], calls: int) -> float:
    result = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(t):
            return t.clone()

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, grad):
            result.append(host_us(fn, calls))
            return grad

    t = torch.zeros(1, device="cuda", requires_grad=True)
    torch.autograd.grad(Probe.apply(t), t, torch.ones_like(t))
    return result[0]


def parts() -> dict[str, Callable[[], object]]:
    inputs = bench_kernels.make_inputs(bench_kernels.SEED, "cuda", requires_grad=False)
    x, dt, A, B, C, D, bias = (inputs[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias"))
    dy = torch.randn_like(x)
    device = x.device

    def body():
        return cs.ssd_gradients(dy, None, x, dt, A, B, C, 128, D, bias, True, None, "cutile")

    body()  # tunes and compiles every stage first, so the call recorded below launches only
    recorded: list[tuple] = []
    launch = ct.launch
    ct.launch = lambda stream, grid, kernel, args: (
        recorded.append((grid, kernel, args)) or launch(stream, grid, kernel, args)
    )
    try:
        body()
    finally:
        ct.launch = launch
    grid, kernel, args = recorded[-1]  # chunk_cumsum_bwd, the backward's last launch

    def guard():
        with torch.cuda.device(device):
            pass

    return {
        "empty": lambda: torch.empty_like(x),
        "current_stream": lambda: torch.cuda.current_stream(device),
        "device_guard": guard,
        "raw_stream": lambda: torch._C._cuda_getCurrentRawStream(device.index),
        "launch": lambda: launch(torch.cuda.current_stream(device), grid, kernel, args),
        "launch_raw": lambda: launch(torch._C._cuda_getCurrentRawStream(device.index), grid, kernel, args),
        "stage": lambda: cs.chunk_cumsum(dt, A, 64, bias, True),
        "body": body,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=50, help="calls per round")
    ap.add_argument(
        "--untuned", action="store_true", help="launch the default configurations (no tuning: host times barely differ)"
    )
    args = ap.parse_args()
    kernels.set_autotune(not args.untuned)
    fns = parts()
    for fn in fns.values():  # compile, tune and warm every part first
        fn()
    torch.cuda.synchronize()
    threads = {"main": on_main, "thread": on_thread, "autograd": on_autograd_thread}
    print(f"{'part':16s}" + "".join(f"{name:>12s}" for name in threads) + "   (host us a call)", flush=True)
    for name, fn in fns.items():
        calls = max(1, args.calls // 10) if name == "body" else args.calls
        row = [run(fn, calls) for run in threads.values()]
        print(f"{name:16s}" + "".join(f"{v:12.1f}" for v in row), flush=True)


if __name__ == "__main__":
    main()
