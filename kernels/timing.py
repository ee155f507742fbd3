"""Time spent inside `kernels.ssd`, forward and backward, as a share of a training step.

When enabled, every `kernels.ssd` call records a mark before and after its forward, and two
identity autograd nodes record marks when its backward starts (the gradient of y arrives) and
ends (the gradients of x, dt, B, C leave). Autograd runs nodes in reverse creation order, so the
nodes between the two marks are the SSD's own. On CUDA the marks are events on the current
stream (read once, at the end of the step); on CPU they are wall-clock readings.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor


class Mark:
    """A point in time on `device`: an event on its current stream (CUDA) or a wall-clock reading (CPU)."""

    def __init__(self, device: torch.device):
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record(torch.cuda.current_stream(device))
            self.wall = None
        else:
            self.event = None
            self.wall = time.perf_counter()

    def ms_until(self, later: Mark) -> float:
        """Milliseconds from this mark to `later`; on CUDA, after `later` has completed."""
        if self.event is not None:
            return self.event.elapsed_time(later.event)
        return (later.wall - self.wall) * 1e3

    def synchronize(self) -> None:
        """Wait until the GPU reaches this mark (nothing to wait for on the CPU)."""
        if self.event is not None:
            self.event.synchronize()


class SSDTimer:
    """Collects (start, end) mark pairs for SSD forward and backward regions."""

    def __init__(self) -> None:
        self.enabled = False
        self.forward: list[tuple[Mark, Mark]] = []
        self.backward: list[list[Mark]] = []

    def reset(self) -> None:
        self.forward.clear()
        self.backward.clear()

    def totals_ms(self) -> tuple[float, float]:
        """(forward ms, backward ms) summed over the recorded regions; call after synchronizing."""
        fwd = sum(a.ms_until(b) for a, b in self.forward)
        bwd = sum(marks[0].ms_until(marks[1]) for marks in self.backward if len(marks) == 2)
        return fwd, bwd


ssd_timer = SSDTimer()


class _BackwardMark(torch.autograd.Function):
    """Identity on tensors; its backward appends a mark to `marks`."""

    @staticmethod
    def forward(ctx, marks: list, device: torch.device, *tensors: Tensor):
        ctx.marks, ctx.device = marks, device
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.marks.append(Mark(ctx.device))
        return (None, None, *grads)


def timed(
    run: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]], x: Tensor, dt: Tensor, B: Tensor, C: Tensor
) -> tuple[Tensor, Tensor]:
    """run(x, dt, B, C) -> (y, state), its forward and backward recorded when the timer is enabled."""
    if not ssd_timer.enabled or torch.compiler.is_compiling():
        return run(x, dt, B, C)
    device = x.device
    inputs = (x, dt, B, C)
    track_backward = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    if track_backward:
        marks: list[Mark] = []
        ssd_timer.backward.append(marks)
        # Created first, so autograd reaches it last: the end of the SSD's backward.
        inputs = _BackwardMark.apply(marks, device, *inputs)
    start = Mark(device)
    y, state = run(*inputs)
    ssd_timer.forward.append((start, Mark(device)))
    if track_backward:
        # Created last, so autograd reaches it first: the start of the SSD's backward.
        (y,) = _BackwardMark.apply(marks, device, y)
    return y, state
