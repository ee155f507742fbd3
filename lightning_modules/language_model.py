"""LightningModule: next-token loss for the Mamba-2 LM, AdamW with warmup + cosine, perplexity."""

from __future__ import annotations

import math

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric

import kernels
from kernels.cutile import tuning
from lightning_modules.mamba2 import Mamba2Config, Mamba2LM, next_token_loss


class LanguageModel(L.LightningModule):
    def __init__(
        self,
        vocab_size: int = 4096,
        d_model: int = 256,
        n_layer: int = 4,
        d_state: int = 64,
        headdim: int = 32,
        expand: int = 2,
        ngroups: int = 1,
        d_conv: int = 4,
        chunk_size: int = 64,
        ssd_backend: str = "auto",
        cutile_autotune: bool = False,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.1,
        compile: bool = False,
    ):
        """
        Args:
            vocab_size: linked from data.vocab_size by train.py.
            d_model, n_layer, d_state, headdim, expand, ngroups, d_conv, chunk_size: Mamba-2 sizes.
            ssd_backend: "auto", "torch", "cutile" or "triton" (see kernels.ssd).
            cutile_autotune: tune cuTile block sizes per shape on first use (cached on disk).
            lr, weight_decay, betas: AdamW; no decay on norms, biases, A_log, D, dt_bias.
            warmup_steps, min_lr_ratio: linear warmup, then cosine down to min_lr_ratio * lr at max_steps.
            compile: run the model through torch.compile.
        """
        super().__init__()
        if ssd_backend not in (*kernels.BACKENDS, "auto"):
            raise ValueError(
                f"model.ssd_backend must be one of auto, {', '.join(kernels.BACKENDS)}; got {ssd_backend!r}"
            )
        if lr <= 0:
            raise ValueError(f"model.lr must be positive, got {lr}")
        self.save_hyperparameters()
        self.config = Mamba2Config(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layer=n_layer,
            d_state=d_state,
            headdim=headdim,
            expand=expand,
            ngroups=ngroups,
            d_conv=d_conv,
            chunk_size=chunk_size,
        )
        self.model = Mamba2LM(self.config)
        self.val_loss = MeanMetric()
        self._forward = self.model

    # -- backend and compilation, once the module sits on its device ------------------------------
    def on_fit_start(self) -> None:
        self.select_backend()

    def on_validation_start(self) -> None:
        self.select_backend()

    def select_backend(self) -> str:
        """Resolve model.ssd_backend on this device (errors say why a backend cannot run) and set it."""
        name = kernels.resolve(self.hparams.ssd_backend, self.device.type, self.device.index)
        if self.model.backend != name:
            self.model.backend = name
            tuning.set_autotune(self.hparams.cutile_autotune)
            rank_zero_info(f"SSD backend: {name} (asked: {self.hparams.ssd_backend}, device: {self.device})")
            if self.hparams.compile:
                self._forward = torch.compile(self.model)
        return name

    # -- steps --------------------------------------------------------------------------------------
    def _loss(self, batch: dict) -> torch.Tensor:
        return next_token_loss(self._forward, batch["input_ids"])

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite training loss ({loss.item()}) at step {self.global_step}. The last checkpoint is "
                "intact: resume with --ckpt_path last, e.g. with a lower model.lr."
            )
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/ppl", torch.exp(loss.detach()))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch))

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/ppl", torch.exp(loss), sync_dist=True)

    # -- optimizer ----------------------------------------------------------------------------------
    def configure_optimizers(self):
        decay, no_decay = [], []
        for p in self.model.parameters():
            (no_decay if p.dim() < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
        groups = [
            {"params": decay, "weight_decay": self.hparams.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        # Not fused: Lightning's mixed precision cannot clip gradients of optimizers that unscale internally.
        optimizer = torch.optim.AdamW(groups, lr=self.hparams.lr, betas=self.hparams.betas)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup, floor = self.hparams.warmup_steps, self.hparams.min_lr_ratio

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
