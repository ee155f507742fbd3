"""This project's own Python per cuTile SSD call, forward and backward, measured on the CPU with the kernel launches
and CUDA stream calls replaced by no-ops (so what is left is the host functions: checks, allocations, tuning
look-ups, launch arguments). Seed shape, bf16. It bounds what this code adds to the eager wall clock; cuTile's
launches, the CUDA allocator and autograd are not in it (results/probes/eager_paths.py measures those on a GPU).

    python results/probes/host_python_cpu.py [--calls 200] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import time
from pathlib import Path

import cuda.tile as ct
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kernels.cutile import ssd as cs  # noqa: E402
from kernels.cutile import tuning  # noqa: E402
from kernels.reference_backward import ssd_backward  # noqa: E402


class Stream:
    def wait_stream(self, other: Stream) -> None:
        pass


def without_gpu() -> None:
    """Launches and stream calls become no-ops; tuning keys name no GPU."""
    ct.launch = lambda stream, grid, kernel, args: None
    torch.cuda.device = lambda device: contextlib.nullcontext()
    torch.cuda.current_stream = lambda device=None: Stream()
    torch.cuda.Stream = lambda device: Stream()
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    tuning._gpu_key = lambda device: "cpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", action="store_true", help="print the backward's cProfile, by own time")
    args = ap.parse_args()
    without_gpu()
    b, l, h, p, n = 4, 16384, 8, 64, 128  # bench_kernels' seed shape
    x = torch.empty(b, l, h, p, dtype=torch.bfloat16)
    dy, B = torch.empty_like(x), torch.empty(b, l, 1, n, dtype=torch.bfloat16)
    C, dt, A, D, bias = torch.empty_like(B), torch.rand(b, l, h), -torch.rand(h), torch.rand(h), torch.rand(h)

    def forward():
        dt_out, dA_cumsum = cs.chunk_cumsum(dt, A, 128, bias, True)
        states, _ = cs.fwd_pass_state(x, B, dt_out, dA_cumsum, None)
        return cs.compute_out(x, B, C, dt_out, dA_cumsum, states, D)

    def backward():
        return ssd_backward(dy, None, x, dt, A, B, C, cs.BACKWARD_CHUNK, D, bias, True, None, cs.CUTILE)

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, seed shape, bf16, launches mocked")
    for fn in (forward, backward):
        for _ in range(3):
            fn()
        start = time.perf_counter()
        for _ in range(args.calls):
            fn()
        print(f"{fn.__name__}: {(time.perf_counter() - start) / args.calls * 1e6:.0f} us of host Python a call")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(lambda: [backward() for _ in range(args.calls)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
