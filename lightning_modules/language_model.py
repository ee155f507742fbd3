"""LightningModule: next-token loss for the Mamba-2 LM, AdamW with warmup + cosine, perplexity.

The training step does not wait for the GPU: the loss is checked for NaN/inf one step late (its value is
copied to the host asynchronously) and, at the latest, before any checkpoint is written. AdamW is fused
(one kernel for all parameters) wherever no gradient scaler is in use, with gradient clipping done here.
Under FSDP (lightning_modules.strategies) each rank holds a flat shard of every parameter: the weight-decay
groups come from tags set on the whole parameters (Mamba2LM), and clipping uses FSDP's norm over all shards.
"""

from __future__ import annotations

import contextlib
import gc
import math

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric

import kernels
import lightning_modules.strategies  # noqa: F401  (registers the "ddp" and "fsdp" strategies)
from kernels.timing import Mark
from lightning_modules.environment import code_fingerprint
from model.mamba2 import Mamba2Config, Mamba2LM, check_layer_backends, layer_backend, next_token_loss

COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


class LanguageModel(L.LightningModule):
    def __init__(
        self,
        config: Mamba2Config,
        cutile_autotune: bool = False,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.1,
        compile: bool = False,
        compile_mode: str | None = None,
    ):
        """
        Args:
            config: the model (sizes, SSD backend and backward); its vocab_size is set by train.py from
                data.vocab_size.
            cutile_autotune: tune cuTile block sizes per shape on first use (cached on disk).
            lr, weight_decay, betas: AdamW; no decay on norms, biases, A_log, D, dt_bias.
            warmup_steps, min_lr_ratio: linear warmup, then cosine down to min_lr_ratio * lr at max_steps.
            compile: run the model (forward and loss) through torch.compile, as one graph (fullgraph).
            compile_mode: torch.compile's mode: None (default), "max-autotune-no-cudagraphs",
                "reduce-overhead" (CUDA graphs), "max-autotune".
        """
        super().__init__()
        if lr <= 0:
            raise ValueError(f"model.lr must be positive, got {lr}")
        if compile_mode not in COMPILE_MODES:
            modes = ", ".join(str(m) for m in COMPILE_MODES)
            raise ValueError(f"model.compile_mode must be one of {modes}; got {compile_mode!r}")
        self.save_hyperparameters()
        self.config = config
        try:
            self.model = Mamba2LM(config)
        except ValueError as err:
            raise ValueError(f"model.config: {err}") from err
        self.parameter_count = self.model.num_parameters()  # before any sharding
        self.val_loss = MeanMetric()
        self._compiled = False
        self._pending_loss: tuple[int, torch.Tensor, Mark] | None = None

    def configure_model(self) -> None:
        """Compile the model (once) when model.compile says so; Lightning calls this before fit/validate."""
        if self.hparams.compile and not self._compiled:
            key_compile_caches()
            self.model.compile(fullgraph=True, mode=self.hparams.compile_mode)
            self._compiled = True

    def on_fit_start(self) -> None:
        """Say which SSD backend runs here (an error naming the reason if the configured one, or a cutile conv or
        norm, cannot)."""
        device = self.device
        name = kernels.resolve(self.config.ssd_backend, device.type, device.index)
        check_layer_backends(self.config, device)
        configured = (self.config.conv_backend, self.config.norm_backend)
        kernels.set_autotune(self.hparams.cutile_autotune)
        rank_zero_info(f"SSD backend: {name} (configured: {self.config.ssd_backend}, device: {device})")
        conv, norm = (layer_backend(value, device) for value in configured)
        rank_zero_info(f"conv and norm: {conv} and {norm} (configured: {' and '.join(configured)})")

    # -- steps --------------------------------------------------------------------------------------
    def _loss(self, batch: dict) -> torch.Tensor:
        return next_token_loss(self.model, batch["input_ids"], batch.get("seq_idx"))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """The batch's loss, copied to the host without a wait; logged once the backward is queued
        (on_before_optimizer_step). Nothing logged here is a device tensor: Lightning reads those with .item() at
        the step's end (the progress bar's every step) and copies a float lr to the device, each a wait that leaves
        the GPU idle while the host prepares the next step."""
        loss = self._loss(batch)
        self._check_finite()  # a micro-batch's loss still pending when gradients accumulate
        copy = loss.detach().to("cpu", non_blocking=True)
        self._pending_loss = (self.global_step, copy, Mark(loss.device))
        self.log("train/lr", torch.tensor(self.optimizers().param_groups[0]["lr"]))  # a host tensor
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Log the step's loss from its host copy, after a wait for the forward only: the backward is queued, so
        the GPU has work while the host waits. FloatingPointError, before the step, if it is not finite."""
        loss = self._check_finite()
        if loss is not None:
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/ppl", torch.exp(loss))

    def _check_finite(self) -> torch.Tensor | None:
        """The last training loss copied to the host, a 0-d CPU tensor, once the copy is done (None if none is
        pending); FloatingPointError if it is NaN or inf."""
        if self._pending_loss is None:
            return None
        step, value, copied = self._pending_loss
        self._pending_loss = None
        copied.synchronize()
        if not torch.isfinite(value):
            raise FloatingPointError(
                f"non-finite training loss ({value.item()}) at step {step}: the run diverged (a lower model.lr "
                "may help)"
            )
        return value

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self._check_finite()  # never write weights a non-finite loss has updated

    def on_train_end(self) -> None:
        self._check_finite()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch))

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/ppl", torch.exp(loss), sync_dist=True)

    # -- optimizer ----------------------------------------------------------------------------------
    def optimizer(self, fused: bool = False) -> torch.optim.AdamW:
        """AdamW over the model's parameters; no weight decay on norms, biases, A_log, D, dt_bias.

        fused: one kernel for every parameter's update (CUDA and CPU); right wherever gradients are
        not scaled (bf16 or fp32, not fp16 with a GradScaler), see configure_gradient_clipping.
        """
        decay, no_decay = [], []
        for p in self.model.parameters():  # tagged by Mamba2LM: under FSDP the shapes here are flat shards
            (no_decay if getattr(p, "_no_weight_decay", False) else decay).append(p)
        groups = [
            {"params": decay, "weight_decay": self.hparams.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=self.hparams.lr, betas=self.hparams.betas, fused=fused)

    def _scaled_gradients(self) -> bool:
        """Whether the trainer's precision scales the loss (fp16 with a GradScaler)."""
        return getattr(self.trainer.precision_plugin, "scaler", None) is not None

    def configure_optimizers(self):
        optimizer = self.optimizer(fused=not self._scaled_gradients())
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup, floor = self.hparams.warmup_steps, self.hparams.min_lr_ratio

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        """Clip as Lightning would, also for the fused AdamW.

        Lightning 2.6 refuses to clip for any optimizer that can unscale gradients itself (fused AdamW),
        though without a gradient scaler (bf16-mixed, fp32) there is nothing to unscale and clipping is
        exact. With a scaler (16-mixed) the optimizer is not fused and Lightning clips as usual. Under FSDP
        each rank holds a shard of the gradients: the norm is FSDP's, over all shards (Lightning's FSDP
        precision plugin has unscaled them already when a scaler is in use).
        """
        sharded = self._fsdp_root()
        if sharded is not None and gradient_clip_val and gradient_clip_algorithm != "value":
            sharded.clip_grad_norm_(gradient_clip_val)
            return
        if self._scaled_gradients() or not gradient_clip_val:
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(self.parameters(), gradient_clip_val, foreach=True)
        else:
            torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val, foreach=True)

    def _fsdp_root(self):
        """The FullyShardedDataParallel module wrapping this one when training under FSDP, else None."""
        wrapped = self.trainer.strategy.model if self._trainer is not None else None
        if not torch.distributed.is_available() or wrapped is None:
            return None
        from torch.distributed.fsdp import FullyShardedDataParallel

        return wrapped if isinstance(wrapped, FullyShardedDataParallel) else None


def key_compile_caches() -> None:
    """Key torch.compile's disk caches (Inductor's FX graphs, AOTAutograd's) by this project's code, unless
    TORCH_COMPILE_CACHE_KEY_TAG (torch.compiler.config.cache_key_tag) already sets a key. Their own keys miss what
    a custom op declares beside its graph node: its tags (needs_fixed_stride_order decides whether Inductor copies
    an input), so after such an edit a process would replay graphs compiled for the code before it."""
    if not torch.compiler.config.cache_key_tag:
        torch.compiler.config.cache_key_tag = f"mamba2-cutile-{code_fingerprint()}"


def release_compiled_graphs() -> None:
    """Free torch.compile's code and CUDA graphs while every module is still loaded. Call it before a process
    that trained under CUDA graphs exits: one that had trained the cuTile kernels under compile_mode
    reduce-overhead otherwise ended with a segmentation fault during interpreter teardown, after its run
    had finished (tests/training/test_train_gpu.py checks the exit code). Never raises: it runs on the way out, where
    an error (a CUDA error met again by the synchronization, say) would replace the one already reported."""
    with contextlib.suppress(Exception):
        torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
