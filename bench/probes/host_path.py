"""Where the host time of an SSD call goes. The cuTile forward + cuTile backward at the seed shape is
host-bound in eager mode: its wall clock a call exceeds its GPU time (BENCHMARKS.md has both). This probe calls one
bench_kernels variant back to back and reports:

- host time a call: the time to enqueue N calls (no synchronization inside; the GPU's queue holds them), over N;
- the same calls under cProfile, each function's own time put into one of five groups: cuTile (its C
  extension's `launch` and any cuTile Python code), `__cuda_array_interface__` (Python array descriptions,
  should a launch read any; a torch tensor goes to cuTile's launch through DLPack in C), this project's host
  code (kernels/), the rest of torch (custom-op dispatch, autograd, allocation, views), other;
- the functions with the most own time.

cProfile slows Python code more than C code, so the groups' shares are indicative; the first line's figure is
the unprofiled one. On a GPU, autograd runs the backward on its device thread, and Python 3.12's cProfile (built on
sys.monitoring) takes every thread's calls into one call stack, so own times there land on the wrong functions:
there, compare calling paths (the op against its bodies called directly) rather than own times.

    python -m bench.probes.host_path --shapes seed,step                 # on a GPU, cutile:cutile
    python -m bench.probes.host_path --shapes seed --variant triton     # mamba_ssm's, for comparison
    python -m bench.probes.host_path --shapes seed --mock               # on the CPU: launches replaced by no-ops

With --mock (no GPU needed) the cuTile stages run their host code on CPU tensors, every launch recorded and
dropped: what it reports is this project's host code and the torch machinery around it, without cuTile's launch
or the CUDA calls.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from bench import bench_kernels

ROOT = Path(__file__).resolve().parents[2]

GROUPS = (
    "cuTile (its launch, in C and Python)",
    "__cuda_array_interface__",
    "kernels/ (this project)",
    "torch (other)",
    "other",
)


def group(func: tuple[str, int, str]) -> str:
    """The group of a pstats function key (file, line, name)."""
    file, _, name = func
    if name == "__cuda_array_interface__":
        return GROUPS[1]
    if "cuda.tile" in name or f"cuda{os.sep}tile{os.sep}" in file:  # the C launch and any Python it calls
        return GROUPS[0]
    if file.startswith(str(ROOT / "kernels")):
        return GROUPS[2]
    if "torch" in file or "torch" in name:
        return GROUPS[3]
    return GROUPS[4]


def mock_cuda(record: bool = True) -> list[tuple]:
    """Let the cuTile host code run on CPU tensors: launches dropped, their arguments recorded in the list returned
    unless `record` is False (host_python_cpu.py, which calls the stages thousands of times, keeps none)."""
    import cuda.tile as ct

    from kernels.cutile import launch, ssd, tuning

    launched: list[tuple] = []
    ct.launch = (lambda stream, grid, kernel, args: launched.append(args)) if record else (lambda *_: None)
    torch.cuda.device = lambda device: contextlib.nullcontext()
    torch.cuda.current_stream = lambda device=None: None
    launch.raw_stream = lambda device: 0  # a CPU build of torch has no CUDA stream to read
    tuning._gpu_key = lambda device: "cpu"
    ssd.check_inputs = lambda *args: None  # it refuses CPU tensors
    return launched


def mock_call(shape: bench_kernels.Shape) -> Callable[[], object]:
    """bench_kernels' forward + backward through the cutile backend's entry, ssd_cutile (kernels.ssd picks no
    cutile on CPU), as kernels.ssd calls it in eager mode."""
    from kernels.cutile import ssd

    inputs = bench_kernels.make_inputs(shape, "cpu", requires_grad=True)
    x, dt, A, B, C, D, dt_bias = leaves = [inputs[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias")]
    dy = torch.randn_like(x)

    def call():
        y, _ = ssd.ssd_cutile(x, dt, A, B, C, shape.chunk_size, D, dt_bias, True, None, None, "cutile")
        return torch.autograd.grad(y, leaves, dy)

    return call


def host_us(call: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    """Microseconds a call to enqueue `calls` calls back to back (the best of 5 rounds)."""
    best = float("inf")
    for _ in range(5):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, time.perf_counter() - start)
    sync()
    return best / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="seed", help="bench_kernels shape sets, comma-separated (seed, step, tiny)")
    ap.add_argument("--variant", default="cutile:cutile", help="a bench_kernels backend (cutile:cutile, triton, ...)")
    ap.add_argument("--calls", type=int, default=20, help="calls per timed round")
    ap.add_argument("--top", type=int, default=15, help="functions listed by own time")
    ap.add_argument("--mock", action="store_true", help="no GPU: the cuTile host code on CPU tensors, no launches")
    args = ap.parse_args()
    if args.mock and args.variant != "cutile:cutile":
        ap.error("--mock runs the cuTile op only (variant cutile:cutile)")
    launched = mock_cuda() if args.mock else []
    sync = (lambda: None) if args.mock else torch.cuda.synchronize

    def settle() -> None:  # between rounds: the GPU done, and no mocked launch's arguments kept alive
        sync()
        launched.clear()

    import kernels

    kernels.set_autotune(not args.mock)  # the tuned configurations, as the benchmark's
    for name in args.shapes.split(","):
        for shape in bench_kernels.SHAPE_SETS[name]:
            call = mock_call(shape) if args.mock else bench_kernels.make_call(shape, args.variant, "fwd_bwd", "cuda")
            for _ in range(3):
                call()
            launched.clear()
            call()
            tensors = sum(isinstance(a, torch.Tensor) for launch in launched for a in launch)
            mocked = f", {len(launched)} launches mocked ({tensors} tensor arguments)" if args.mock else ""
            launched.clear()
            us = host_us(call, args.calls, settle)
            print(f"{args.variant} {name} {shape}: host {us:.0f} us a call{mocked}")
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                call()
            sync()
            profiler.disable()
            launched.clear()
            stats = pstats.Stats(profiler).stats  # func -> (calls, primitive calls, own s, cumulative s, callers)
            own: dict[str, float] = defaultdict(float)
            for func, (_, _, tottime, _, _) in stats.items():
                own[group(func)] += tottime
            total = sum(own.values())
            print(f"  under cProfile: {total / args.calls * 1e6:.0f} us a call, own time by group:")
            for g in GROUPS:
                print(f"    {own[g] / args.calls * 1e6:8.1f} us  {own[g] / total:5.1%}  {g}")
            print(f"  the {args.top} functions with the most own time (us a call, calls a call):")
            ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[: args.top]
            for (file, line, fname), (ncalls, _, tottime, _, _) in ranked:
                where = f"{Path(file).name}:{line}" if line else file
                print(f"    {tottime / args.calls * 1e6:8.1f}  x{ncalls / args.calls:5.1f}  {fname} ({where})")


if __name__ == "__main__":
    main()
