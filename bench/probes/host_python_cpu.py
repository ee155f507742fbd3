"""The host functions' own Python per cuTile stage, on a CPU: the forward's three stages with cuTile's launch, the
device guard, the current stream and tuning's GPU name replaced by no-ops (host_path.mock_cuda), on CPU tensors. What remains is what
this project's code does per call (tuning's lookup, the launch spec, views, the output's allocation on the CPU):
the part of a stage's host time that is not torch's CUDA calls or cuTile's launch.

    python -m bench.probes.host_python_cpu
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable

import cuda.tile as ct
import torch

from bench.inputs import stage_inputs
from bench.probes.host_path import mock_cuda
from kernels.cutile.chunk_cumsum import chunk_cumsum
from kernels.cutile.compute_out import compute_out
from kernels.cutile.fwd_pass_state import fwd_pass_state


def host_us(call: Callable[[], object], n: int = 2000) -> float:
    """Microseconds a call, the mean of n after one."""
    call()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    mock_cuda(record=False)
    torch.set_num_threads(1)
    t = stage_inputs(torch.bfloat16, 128, 64, 128, l=1024, seed=0, device="cpu")
    dt_out, dA, D = (t[k].to(torch.float32) for k in ("dt_out", "dA_cumsum", "D"))
    states = t["chunk_states"].to(torch.bfloat16)
    stages = {
        "chunk_cumsum": lambda: chunk_cumsum(t["dt"], t["A"], 128, t["dt_bias"], True),
        "fwd_pass_state": lambda: fwd_pass_state(t["x"], t["B"], dt_out, dA),
        "compute_out": lambda: compute_out(t["x"], t["B"], t["C"], dt_out, dA, states, D),
    }
    print(
        f"torch {torch.__version__}, cuda-tile {ct.__version__ if hasattr(ct, '__version__') else '?'}, one CPU thread"
    )
    for name, call in stages.items():
        print(f"{name:16s} {host_us(call):6.1f} us a call")
    print(f"{'torch.empty':16s} {host_us(lambda: torch.empty((2, 1024, 4, 64), dtype=torch.bfloat16)):6.1f} us a call")
    profile = cProfile.Profile()
    profile.runcall(lambda: [stages["compute_out"]() for _ in range(2000)])
    pstats.Stats(profile).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
