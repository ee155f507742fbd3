"""The forward / backward / optimizer split of a training step, read without stalling the GPU.

    start ── forward ──> loss ── backward ──> gradients ── optimizer ──> end
    step_ms = forward_ms + backward_ms + optimizer_ms;  ssd_forward_ms, ssd_backward_ms inside them

A `StepMarks` records a mark (kernels.timing.Mark: a CUDA event, or the host clock on a CPU) at each
boundary, takes the SSD's own marks (kernels.ssd_timer) and the process's peak memory (host-side
counters: allocated, and reserved, which includes the private pools of CUDA graphs) when the step
ends, and is read later: `read()` waits for that step's last event only, so when it is called one
step late the GPU still has the newer step queued and never idles for the measurement.
`StepMarks` is the one implementation of the split: the Lightning callback (step_timer.py) places
the marks from trainer hooks, `TimedStep` (the benchmarks) places them around its own code.
"""

from __future__ import annotations

from collections import deque

import torch

import kernels
from kernels.timing import Mark, SSDTimer

BOUNDARIES = ("start", "forward", "backward", "end")


class StepMarks:
    """Marks of one training step on `device`; `mark(name)` at each boundary, `end()`, then `read()`."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.marks: dict[str, Mark] = {}
        self.ssd = SSDTimer()
        self.peak_gib: float | None = None
        self.reserved_gib: float | None = None
        self.start_gib: float | None = None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_gib = torch.cuda.memory_allocated(self.device) / 2**30
        kernels.ssd_timer.reset()
        self.mark("start")

    def mark(self, boundary: str) -> None:
        if boundary not in BOUNDARIES:
            raise ValueError(f"unknown step boundary {boundary!r}; one of {', '.join(BOUNDARIES)}")
        self.marks[boundary] = Mark(self.device)

    def end(self) -> None:
        """Mark the end; keep this step's SSD marks (the global timer is reset for the next step)."""
        self.mark("end")
        self.ssd.forward[:] = kernels.ssd_timer.forward
        self.ssd.backward[:] = kernels.ssd_timer.backward
        kernels.ssd_timer.reset()
        if self.device.type == "cuda":
            self.peak_gib = torch.cuda.max_memory_allocated(self.device) / 2**30
            self.reserved_gib = torch.cuda.max_memory_reserved(self.device) / 2**30

    @property
    def complete(self) -> bool:
        """Whether every boundary was marked (a step Lightning skipped has no backward)."""
        return all(b in self.marks for b in BOUNDARIES)

    def read(self) -> dict[str, float]:
        """{step_ms, forward_ms, backward_ms, optimizer_ms, ssd_forward_ms, ssd_backward_ms[, peak_gib,
        reserved_gib, above_start_gib]}.

        peak_gib: the most memory the process's tensors held during the step; reserved_gib: the most the
        allocator held, CUDA graphs' private pools included. Both are the process's: where several models
        live in it (the benchmarks' variants), each figure includes the others' weights and optimizer state.
        A CUDA-graph replay allocates nothing (its tensors live in the pool, recorded in warm-up), so under
        CUDA graphs only reserved_gib bounds the step's memory. above_start_gib: peak_gib less what the
        process held when the step began, the step's own transient memory (activations, gradients).

        Waits until the GPU has passed this step's end mark (not for work queued after it).
        """
        if not self.complete:
            raise RuntimeError(f"step marks {sorted(self.marks)} lack one of {', '.join(BOUNDARIES)}")
        m = self.marks
        m["end"].synchronize()
        ssd_forward, ssd_backward = self.ssd.totals_ms()
        out = {
            "step_ms": m["start"].ms_until(m["end"]),
            "forward_ms": m["start"].ms_until(m["forward"]),
            "backward_ms": m["forward"].ms_until(m["backward"]),
            "optimizer_ms": m["backward"].ms_until(m["end"]),
            "ssd_forward_ms": ssd_forward,
            "ssd_backward_ms": ssd_backward,
        }
        if self.peak_gib is not None:
            out["peak_gib"] = self.peak_gib
            out["reserved_gib"] = self.reserved_gib
            out["above_start_gib"] = self.peak_gib - self.start_gib
        return out


class Lagged:
    """A queue of ended steps, read `lag` steps late: `push` one, get back those now old enough.

    lag 1 reads step N-1 when step N has been queued; lag 0 reads every step at once (one
    synchronization per step). `drain()` reads what is left, e.g. at the end of training.
    """

    def __init__(self, lag: int = 1):
        if lag < 0:
            raise ValueError(f"lag must be >= 0, got {lag}")
        self.lag = lag
        self.pending: deque[tuple[object, StepMarks]] = deque()

    def push(self, key: object, marks: StepMarks) -> list[tuple[object, dict[str, float]]]:
        """Queue `marks` under `key`; return [(key, reading)] of the steps `lag` or more behind it."""
        self.pending.append((key, marks))
        out = []
        while len(self.pending) > self.lag:
            k, m = self.pending.popleft()
            out.append((k, m.read()))
        return out

    def drain(self) -> list[tuple[object, dict[str, float]]]:
        out = [(k, m.read()) for k, m in self.pending]
        self.pending.clear()
        return out
