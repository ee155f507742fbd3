"""LightningModule: next-token loss for the Mamba-2 LM, AdamW with warmup + cosine, perplexity."""

from __future__ import annotations

import math

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric

import kernels
from lightning_modules.model.mamba2 import Mamba2Config, Mamba2LM, next_token_loss


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
    ):
        """
        Args:
            config: the model (sizes, SSD backend and backward); its vocab_size is set by train.py from
                data.vocab_size.
            cutile_autotune: tune cuTile block sizes per shape on first use (cached on disk).
            lr, weight_decay, betas: AdamW; no decay on norms, biases, A_log, D, dt_bias.
            warmup_steps, min_lr_ratio: linear warmup, then cosine down to min_lr_ratio * lr at max_steps.
            compile: run the model through torch.compile (fullgraph).
        """
        super().__init__()
        if lr <= 0:
            raise ValueError(f"model.lr must be positive, got {lr}")
        self.save_hyperparameters()
        self.config = config
        self.model = Mamba2LM(config)
        if compile:
            self.model.compile(fullgraph=True)
        self.val_loss = MeanMetric()

    def on_fit_start(self) -> None:
        """Say which SSD backend runs here (an error naming the reason if the configured one cannot)."""
        device = self.device
        name = kernels.resolve(self.config.ssd_backend, device.type, device.index)
        kernels.set_autotune(self.hparams.cutile_autotune)
        rank_zero_info(f"SSD backend: {name} (configured: {self.config.ssd_backend}, device: {device})")

    # -- steps --------------------------------------------------------------------------------------
    def _loss(self, batch: dict) -> torch.Tensor:
        return next_token_loss(self.model, batch["input_ids"])

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
    def optimizer(self) -> torch.optim.AdamW:
        """AdamW over the model's parameters; no weight decay on norms, biases, A_log, D, dt_bias."""
        decay, no_decay = [], []
        for p in self.model.parameters():
            (no_decay if p.dim() < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
        groups = [
            {"params": decay, "weight_decay": self.hparams.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        # Not fused: Lightning's mixed precision cannot clip gradients of optimizers that unscale internally.
        return torch.optim.AdamW(groups, lr=self.hparams.lr, betas=self.hparams.betas)

    def configure_optimizers(self):
        optimizer = self.optimizer()
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup, floor = self.hparams.warmup_steps, self.hparams.min_lr_ratio

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
