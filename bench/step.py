"""A training step outside Lightning, timed as the Lightning callback times one, for the benchmarks.

`TimedStep` runs the step LanguageModel runs and places lightning_modules.step_marks.StepMarks around its own
code; `warm_up` and `alternate` run several such steps in turn, so drift hits each alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from kernels.timing import Mark
from lightning_modules.step_marks import StepMarks


class TimedStep:
    """A training step outside Lightning, as LanguageModel runs it: bf16 autocast on a GPU, the
    next-token loss, backward, gradient clipping, the optimizer step. For the benchmarks.

    `loss_fn(tokens)` maps token ids (b, l + 1) to the scalar loss (the model, compiled or not).
    """

    def __init__(
        self,
        loss_fn,
        parameters: list[nn.Parameter],
        optimizer: torch.optim.Optimizer,
        device: torch.device | str,
        clip: float = 1.0,
    ):
        self.loss_fn, self.parameters, self.optimizer, self.clip = loss_fn, parameters, optimizer, clip
        self.device = torch.device(device)

    def __call__(self, tokens: torch.Tensor, timed: bool = True) -> StepMarks | None:
        """Run one step on `tokens`; its marks when `timed` (read them later), else None."""
        marks = StepMarks(self.device) if timed else None
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = self.loss_fn(tokens)
        if marks:
            marks.mark("forward")
        loss.backward()
        if marks:
            marks.mark("backward")
        torch.nn.utils.clip_grad_norm_(self.parameters, self.clip, foreach=True)
        self.optimizer.step()
        if marks:
            marks.end()
        return marks

    def resident_gib(self) -> float:
        """GiB the step keeps between calls on its device: parameters, their gradients, optimizer state."""
        state = [t for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        tensors = [*self.parameters, *(p.grad for p in self.parameters if p.grad is not None), *state]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values()) / 2**30


Step = Callable[..., "StepMarks | None"]  # a TimedStep, or a wrapper with its call signature


def token_batches(vocab_size: int, batch: int, seqlen: int, seed: int, device, count: int = 4) -> list[torch.Tensor]:
    """`count` batches of random token ids (batch, seqlen + 1), the same for a given seed."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (batch, seqlen + 1), generator=gen).to(device) for _ in range(count)]


def warm_up(steps: dict[str, Step], batches: list[torch.Tensor], count: int, device) -> dict[str, float]:
    """Each step `count` times, untimed (compilation and autotuning happen here): seconds per step name."""
    seconds = {}
    for name, step in steps.items():
        start = time.perf_counter()
        for i in range(count):
            step(batches[i % len(batches)], timed=False)
        Mark(torch.device(device)).synchronize()
        seconds[name] = time.perf_counter() - start
    return seconds


def alternate(
    steps: dict[str, Step], batches: list[torch.Tensor], count: int, device, timed: bool = True
) -> tuple[float, dict[str, list]]:
    """`count` rounds, each step twice per round in turn (drift hits each alike), the second call timed: a timed
    step follows a step of its own, as in training, never another variant's, whose work can run on into the
    next step's span (docs/measuring.md). Returns ms of the whole loop, and each step's marks (StepMarks of its
    second calls when `timed`, else None) to read afterwards."""
    marks: dict[str, list] = {name: [] for name in steps}
    start = Mark(torch.device(device))
    for i in range(count):
        batch = batches[i % len(batches)]
        for name, step in steps.items():
            step(batch, timed=False)  # the lead-in
            marks[name].append(step(batch, timed=timed))
    end = Mark(torch.device(device))
    end.synchronize()
    return start.ms_until(end), marks


def median_split(samples: list[dict[str, float]]) -> dict[str, float]:
    """The median of each field over steps' read() splits."""
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}
