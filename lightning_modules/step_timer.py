"""Step-time breakdown of every training step, logged under stable metric names.

    time/step_ms        batch start -> batch end (forward + backward + optimizer)
    time/forward_ms     batch start -> on_before_backward (zero_grad, training_step)
    time/backward_ms    on_before_backward -> on_after_backward (under DDP: with the overlapped all-reduce)
    time/optimizer_ms   on_after_backward -> batch end (clipping, optimizer step)
    time/ssd_forward_ms, time/ssd_backward_ms   time inside kernels.ssd (see kernels.timing)
    throughput/tokens_per_s                     all ranks' tokens over the step time
    perf/mfu            train FLOPs/token (lightning_modules.flops) x tokens/s over the GPUs' bf16 peak
    memory/peak_gib     peak allocated CUDA memory in the step (max over ranks)
    time/step_ms_max, time/step_ms_rank{r}      per-rank step times gathered, so a slow rank shows
On CUDA the marks are events on the current stream, read with one synchronization at the end of
the step; on CPU they are wall-clock readings. The first `warmup_steps` steps (compilation,
autotuning) are logged as time/warmup_s and left out of the steady-state summary written at the end.
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
from lightning_modules.environment import environment
from lightning_modules.flops import peak_tflops, train_flops_per_token


class StepTimer(Callback):
    def __init__(self, warmup_steps: int = 3, summary_file: str = "step_times.json", peak_tflops: float | None = None):
        """
        Args:
            warmup_steps: first steps reported as warm-up (compilation, autotuning), not steady state.
            summary_file: steady-state medians, written into the trainer's root dir at the end of fit.
            peak_tflops: per-GPU dense bf16 peak for MFU; None picks it from the GPU name when known.
        """
        self.warmup_steps = warmup_steps
        self.summary_file = summary_file
        self.peak = peak_tflops
        self.steps: list[dict[str, float]] = []
        self.warmup_s = 0.0
        self._marks: dict[str, Mark] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.peak is None and pl_module.device.type == "cuda":
            self.peak = peak_tflops(torch.cuda.get_device_name(pl_module.device))
        self.flops_per_token = train_flops_per_token(pl_module.config)
        kernels.ssd_timer.enabled = True
        self.steps.clear()
        self.warmup_s = 0.0
        self._seen = 0
        env = environment()
        run_info = {
            "ssd_backend_used": pl_module.model.backend,
            "versions": {k: env.get(k) for k in ("torch", "triton", "cuda_tile", "mamba_ssm", "lightning", "gpu")},
            "world_size": trainer.world_size,
            "train_flops_per_token": self.flops_per_token,
            "parameters": pl_module.model.num_parameters(),
        }
        for logger in trainer.loggers:
            logger.log_hyperparams(run_info)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        kernels.ssd_timer.enabled = False
        if trainer.is_global_zero and self.summary_file:
            path = Path(trainer.default_root_dir) / self.summary_file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.summary(), indent=1) + "\n")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        kernels.ssd_timer.reset()
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._wall = time.perf_counter()
        self._marks = {"start": Mark(pl_module.device)}

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._marks["forward"] = Mark(pl_module.device)

    def on_after_backward(self, trainer, pl_module) -> None:
        self._marks["backward"] = Mark(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        m = self._marks
        m["end"] = Mark(pl_module.device)
        m["end"].synchronize()
        if "forward" not in m or "backward" not in m:
            return  # a skipped step (no loss returned)
        ssd_fwd, ssd_bwd = kernels.ssd_timer.totals_ms()
        step_ms = m["start"].ms_until(m["end"])
        tokens = batch["input_ids"][:, 1:].numel() * trainer.world_size
        record = {
            "time/step_ms": step_ms,
            "time/forward_ms": m["start"].ms_until(m["forward"]),
            "time/backward_ms": m["forward"].ms_until(m["backward"]),
            "time/optimizer_ms": m["backward"].ms_until(m["end"]),
            "time/ssd_forward_ms": ssd_fwd,
            "time/ssd_backward_ms": ssd_bwd,
            "throughput/tokens_per_s": tokens / (step_ms / 1e3),
        }
        if pl_module.device.type == "cuda":
            record["memory/peak_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
        if self.peak:
            achieved = self.flops_per_token * record["throughput/tokens_per_s"]
            record["perf/mfu"] = achieved / (self.peak * 1e12 * trainer.world_size)
        if trainer.world_size > 1:
            per_rank = pl_module.all_gather(torch.tensor(step_ms, device=pl_module.device)).flatten().tolist()
            record["time/step_ms_max"] = max(per_rank)
            for r, v in enumerate(per_rank):
                record[f"time/step_ms_rank{r}"] = v
            if "memory/peak_gib" in record:
                mem = pl_module.all_gather(torch.tensor(record["memory/peak_gib"], device=pl_module.device))
                record["memory/peak_gib"] = float(mem.max())
        self._seen += 1
        if self._seen <= self.warmup_steps:
            self.warmup_s += time.perf_counter() - self._wall
            record["time/warmup_s"] = self.warmup_s
        else:
            self.steps.append(record)
        pl_module.log_dict(record, on_step=True, on_epoch=False, rank_zero_only=True)

    def summary(self) -> dict[str, float]:
        """Steady-state medians of every metric, plus the warm-up seconds and the step count."""
        out: dict[str, float] = {"warmup_s": self.warmup_s, "steady_steps": len(self.steps)}
        for key in self.steps[0] if self.steps else []:
            out[key] = statistics.median(s[key] for s in self.steps)
        return out
