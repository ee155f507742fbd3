"""Step-time breakdown of every training step, logged under stable metric names.

    time/step_ms        batch start -> batch end (forward + backward + optimizer)
    time/forward_ms     batch start -> on_before_backward (zero_grad, training_step)
    time/backward_ms    on_before_backward -> on_after_backward (under DDP: with the overlapped all-reduce)
    time/optimizer_ms   on_after_backward -> batch end (clipping, optimizer step)
    time/between_steps_ms   the previous step's end -> this step's start: what the GPU waits for the host between
                        steps (data, logging, the progress bar, validation where it runs); near 0 while the host
                        is ahead. Not part of step_ms (nor of tokens/s); absent from the first step
    time/ssd_forward_ms, time/ssd_backward_ms   time inside kernels.ssd (eager only: see kernels.timing)
    time/timer_host_ms  host time this callback spent in its hooks during the step (its own cost)
    throughput/tokens_per_s                     all ranks' tokens over the step time
    perf/mfu            train FLOPs/token (model.flops) x tokens/s over the GPUs' bf16 peak
    memory/peak_gib     peak allocated CUDA memory in the step (max over ranks)
    memory/reserved_gib peak memory the allocator held in the step, CUDA graphs' pools included (max over ranks)
    memory/above_start_gib  the allocated peak less what was allocated when the step began (max over ranks)
    time/step_ms_max, time/step_ms_rank{r}      per-rank step times gathered, so a slow rank shows
    time/first_step_s   the process's start -> the first step's end: imports, data, compilation, tuning

The split is lightning_modules.step_marks.StepMarks. Its marks are read `lag` steps late (default
one): the host waits for step N-1's last event after queueing step N, so the GPU is never left idle
by the measurement. Under DDP the per-rank times are gathered every `gather_every` steps (a gather is
a synchronization). Records are logged with the step they belong to. The first `warmup_steps` steps
(compilation, autotuning) are logged as time/warmup_s and left out of the steady-state summary
written at the end.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

import kernels
from kernels.timing import Mark
from lightning_modules.environment import environment, peak_tflops, process_age_s
from lightning_modules.step_marks import Lagged, StepMarks
from model.flops import train_flops_per_token


class StepTimer(Callback):
    def __init__(
        self,
        warmup_steps: int = 3,
        summary_file: str = "step_times.json",
        peak_tflops: float | None = None,
        lag: int = 1,
        gather_every: int = 20,
    ):
        """
        Args:
            warmup_steps: first steps reported as warm-up (compilation, autotuning), not steady state.
            summary_file: steady-state medians, written into the trainer's root dir at the end of fit.
            peak_tflops: per-GPU dense bf16 peak for MFU; None picks it from the GPU name when known.
            lag: read each step's marks this many steps later (0: at once, synchronizing every step).
            gather_every: under DDP, gather the ranks' step times every this many steps.
        """
        if warmup_steps < 0 or gather_every < 1:
            raise ValueError(f"need warmup_steps >= 0 and gather_every >= 1, got {warmup_steps}, {gather_every}")
        self.warmup_steps = warmup_steps
        self.summary_file = summary_file
        self.peak = peak_tflops
        self.lag = lag
        self.gather_every = gather_every
        self.steps: list[dict[str, float]] = []
        self.warmup_s = 0.0
        self.first_step_s: float | None = None
        self.first_start_s: float | None = None

    # -- hooks: place the marks ---------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.peak is None and pl_module.device.type == "cuda":
            self.peak = peak_tflops(torch.cuda.get_device_name(pl_module.device))
        self.flops_per_token = train_flops_per_token(pl_module.config)
        kernels.ssd_timer.enabled = True
        self.steps.clear()
        self.warmup_s = 0.0
        self.first_step_s = self.first_start_s = None
        self._queue = Lagged(self.lag)
        self._ungathered: list[tuple[int, dict[str, float]]] = []
        self._marks: StepMarks | None = None
        self._first: Mark | None = None
        self._previous_end: Mark | None = None
        self._count = 0
        self._host_s = 0.0
        env = environment()
        device = pl_module.device
        run_info = {
            "ssd_backend_used": kernels.resolve(pl_module.config.ssd_backend, device.type, device.index),
            "versions": {k: env.get(k) for k in ("torch", "triton", "cuda_tile", "mamba_ssm", "lightning", "gpu")},
            "world_size": trainer.world_size,
            "train_flops_per_token": self.flops_per_token,
            "parameters": pl_module.parameter_count,
        }
        for logger in trainer.loggers:
            logger.log_hyperparams(run_info)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        t = time.perf_counter()
        self._marks = StepMarks(pl_module.device)
        self._step = trainer.global_step
        self._tokens = batch["input_ids"][:, 1:].numel() * trainer.world_size
        if self._first is None:
            self._first = self._marks.marks["start"]
            self.first_start_s = process_age_s()
        self._host_s += time.perf_counter() - t

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        t = time.perf_counter()
        self._marks.mark("forward")
        self._host_s += time.perf_counter() - t

    def on_after_backward(self, trainer, pl_module) -> None:
        t = time.perf_counter()
        self._marks.mark("backward")
        self._host_s += time.perf_counter() - t

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        t = time.perf_counter()
        marks, self._marks = self._marks, None
        marks.end()
        previous_end, self._previous_end = self._previous_end, marks.marks["end"]
        if not marks.complete:
            return  # a skipped step (no loss returned)
        info = {
            "step": self._step,
            "index": self._count,
            "tokens": self._tokens,
            "host_s": self._host_s,
            "marks": marks,
            "previous_end": previous_end,
        }
        self._count += 1
        ready = self._queue.push(info, marks)
        self._host_s = time.perf_counter() - t  # this hook's own time counts towards the next step
        self._record(trainer, pl_module, ready)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        kernels.ssd_timer.enabled = False
        self._record(trainer, pl_module, self._queue.drain(), final=True)
        if trainer.is_global_zero and self.summary_file:
            path = Path(trainer.default_root_dir) / self.summary_file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.summary(), indent=1) + "\n")

    # -- records: read late, gathered in batches, logged with their own step -----------------------
    def _record(self, trainer, pl_module, ready: list, final: bool = False) -> None:
        for info, split in ready:
            record = {f"time/{k}": v for k, v in split.items() if not k.endswith("_gib")}
            record["time/timer_host_ms"] = info["host_s"] * 1e3
            if info["previous_end"] is not None:
                record["time/between_steps_ms"] = info["previous_end"].ms_until(info["marks"].marks["start"])
            record["throughput/tokens_per_s"] = info["tokens"] / (split["step_ms"] / 1e3)
            record |= {f"memory/{k}": v for k, v in split.items() if k.endswith("_gib")}
            if self.peak:
                achieved = self.flops_per_token * record["throughput/tokens_per_s"]
                record["perf/mfu"] = achieved / (self.peak * 1e12 * trainer.world_size)
            if info["index"] == 0 and self.first_start_s is not None:
                self.first_step_s = self.first_start_s + split["step_ms"] / 1e3
                record["time/first_step_s"] = self.first_step_s
            if info["index"] < self.warmup_steps:  # first start to this step's end, gaps included
                self.warmup_s = self._first.ms_until(info["marks"].marks["end"]) / 1e3
                record["time/warmup_s"] = self.warmup_s
            else:
                self.steps.append(record)
            self._ungathered.append((info["step"], record))
        if trainer.world_size > 1:
            if not self._ungathered or (len(self._ungathered) < self.gather_every and not final):
                return
            self._gather(pl_module)
        self._log(trainer)

    def _gather(self, pl_module) -> None:
        """Per-rank step times and the max memory peaks of every buffered record, in one all_gather."""
        records = [r for _, r in self._ungathered]
        memory = ("memory/peak_gib", "memory/reserved_gib", "memory/above_start_gib")
        local = torch.tensor(
            [[r["time/step_ms"], *(r.get(k, 0.0) for k in memory)] for r in records],
            device=pl_module.device,
            dtype=torch.float64,
        )
        columns = 1 + len(memory)
        gathered = pl_module.all_gather(local).reshape(-1, len(records), columns).cpu()  # (ranks, steps, columns)
        for i, r in enumerate(records):
            per_rank = gathered[:, i, 0].tolist()
            r["time/step_ms_max"] = max(per_rank)
            for rank, v in enumerate(per_rank):
                r[f"time/step_ms_rank{rank}"] = v
            for j, k in enumerate(memory, 1):
                if k in r:
                    r[k] = float(gathered[:, i, j].max())

    def _log(self, trainer) -> None:
        if trainer.is_global_zero:
            for step, record in self._ungathered:
                for logger in trainer.loggers:
                    logger.log_metrics(record, step=step)
        self._ungathered.clear()

    def summary(self) -> dict[str, float]:
        """Steady-state medians of every metric, plus the warm-up seconds and the step count."""
        out: dict[str, float] = {"warmup_s": self.warmup_s, "steady_steps": len(self.steps)}
        if self.first_step_s is not None:
            out["first_step_s"] = self.first_step_s
        for key in self.steps[0] if self.steps else []:
            out[key] = statistics.median(s[key] for s in self.steps)
        return out
