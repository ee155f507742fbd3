"""Where the eager cuTile forward + backward's host time goes beyond its own code, at the seed shape: the SSD called
through torch.library's custom op (`op`, what torch.compile traces), through kernels.ssd (`via_ssd`: in eager mode
the autograd.Function kernels.cutile.ssd.EagerSSD over the same bodies), through a subclass of that Function
whose backward times its body (`twin`), and the bodies called directly, without autograd (`direct`); Triton through
this project's custom op (`triton_op`), through kernels.ssd (`triton_via_ssd`: in eager mode the autograd.Function
kernels.triton_backend.EagerTriton) and through mamba_ssm's own autograd.Function (`triton_native`). Per call, 5
rounds alternating: the host time to enqueue 20 calls behind a long GPU sleep (the host's cost alone) and the wall
time of 20 calls back to back (CUDA events). Then the host time of the backward body alone, in the
autograd.Function's backward (on autograd's device thread) and called directly (on the calling thread), each the
median of 20 calls enqueued behind a GPU sleep.

    python results/probes/eager_paths.py        # on a GPU; results/probes/eager_paths_2026-12-02*.txt
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_kernels  # noqa: E402

import kernels  # noqa: E402
from kernels.cutile import ssd as cs  # noqa: E402
from lightning_modules.measure.timing import wall_ms  # noqa: E402

BODY_MS: list[float] = []  # host milliseconds of each Twin.backward body


def timed_gradients(*args) -> list[torch.Tensor]:
    """cs.ssd_gradients, its host milliseconds appended to BODY_MS."""
    start = time.perf_counter()
    grads = cs.ssd_gradients(*args)
    BODY_MS.append((time.perf_counter() - start) * 1e3)
    return grads


class Twin(cs.EagerSSD):
    """kernels.ssd's eager cuTile path with its backward body timed."""

    @staticmethod
    def backward(ctx, dy, dfinal):
        return cs._input_gradients(timed_gradients, ctx, dy, dfinal)


def seed_inputs() -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...], torch.Tensor]:
    """bench_kernels' seed-shape inputs (leaves needing gradients), as (leaves, (x, dt, A, B, C, D, dt_bias), dy)."""
    inputs = bench_kernels.make_inputs(bench_kernels.SEED, "cuda", requires_grad=True)
    x = inputs["x"]
    return (
        list(inputs.values()),
        tuple(inputs[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias")),
        torch.randn_like(x),
    )


def calls() -> list[Callable]:
    leaves, (x, dt, A, B, C, D, bias), dy = seed_inputs()
    args = (x, dt, A, B, C, 128, D, bias, True, None, "cutile")

    def op():
        with torch.autocast("cuda", enabled=False):
            y, _ = torch.ops.mamba2_cutile.ssd_fwd(*args)
        return torch.autograd.grad(y, leaves, dy)

    def via_ssd():
        y = kernels.ssd(x, dt, A, B, C, 128, D=D, dt_bias=bias, dt_softplus=True, backend="cutile", backward="cutile")
        return torch.autograd.grad(y, leaves, dy)

    def twin():
        with torch.autocast("cuda", enabled=False):
            y, _ = Twin.apply(*args)
        return torch.autograd.grad(y, leaves, dy)

    def direct():
        cs.ssd_forward(*args)
        return cs.ssd_gradients(dy, None, x, dt, A, B, C, 128, D, bias, True, None, "cutile")

    fns = [op, via_ssd, twin, direct]
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        import kernels.triton_backend  # registers torch.ops.mamba2_triton
    except ImportError as e:
        print("no triton:", e)
        return fns

    def triton_op():
        with torch.autocast("cuda", enabled=False):
            y, _ = torch.ops.mamba2_triton.ssd_fwd(x, dt, A, B, C, 128, D, bias, True, None)
        return torch.autograd.grad(y, leaves, dy)

    def triton_via_ssd():
        y = kernels.ssd(x, dt, A, B, C, 128, D=D, dt_bias=bias, dt_softplus=True, backend="triton")
        return torch.autograd.grad(y, leaves, dy)

    def triton_native():
        y = mamba_chunk_scan_combined(x, dt, A, B, C, 128, D=D, dt_bias=bias, dt_softplus=True)
        return torch.autograd.grad(y, leaves, dy)

    return fns + [triton_op, triton_via_ssd, triton_native]


def backward_body_ms() -> tuple[float, float]:
    """Host ms of the cuTile backward body: inside Twin's backward (autograd's device thread), and called directly."""
    leaves, (x, dt, A, B, C, D, bias), dy = seed_inputs()
    y, _ = Twin.apply(x, dt, A, B, C, 128, D, bias, True, None, "cutile")
    BODY_MS.clear()
    direct = []
    for _ in range(20):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(5e7))
        y, _ = Twin.apply(x, dt, A, B, C, 128, D, bias, True, None, "cutile")
        torch.autograd.grad(y, leaves, dy)
        torch.cuda._sleep(int(5e7))
        start = time.perf_counter()
        cs.ssd_gradients(dy, None, x, dt, A, B, C, 128, D, bias, True, None, "cutile")
        direct.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(BODY_MS), statistics.median(direct)


def enqueue_ms(fn: Callable, n: int = 20) -> float:
    """Host milliseconds per call of enqueueing n calls behind a GPU sleep (about 0.25 s), so none waits for the GPU."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(5e8))
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - start) * 1e3 / n
    torch.cuda.synchronize()
    return host


def main() -> None:
    kernels.set_autotune(True)
    fns = calls()
    for fn in fns:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    host = {fn.__name__: [] for fn in fns}
    wall = {fn.__name__: [] for fn in fns}
    for _ in range(5):
        for fn in fns:
            host[fn.__name__].append(enqueue_ms(fn))
            wall[fn.__name__].append(wall_ms(fn, 20))
    for name in host:
        h, w = host[name], wall[name]
        print(
            f"{name:14s} host {statistics.median(h):.3f} ms [{min(h):.3f}-{max(h):.3f}]  "
            f"wall {statistics.median(w):.3f} ms [{min(w):.3f}-{max(w):.3f}]",
            flush=True,
        )
    on_thread, direct = backward_body_ms()
    print(f"backward body host ms: {on_thread:.3f} in autograd's backward, {direct:.3f} called directly", flush=True)


if __name__ == "__main__":
    main()
