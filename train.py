"""Train the Mamba-2 language model. The YAML is the whole experiment:

    python train.py --config configs/tiny.yaml
    python train.py --config configs/tiny.yaml --ckpt_path last              # resume
    python train.py --config configs/small.yaml --model.config.ssd_backend cutile --trainer.devices 2 --trainer.strategy ddp
    python train.py --help                                                   # every key

Keys: trainer.* (Lightning Trainer), model.* (lightning_modules.LanguageModel), data.*
(data.TextDataModule), step_timer.* (lightning_modules.StepTimer), checkpoint.* (ModelCheckpoint),
logging.* (loggers), ckpt_path. Unknown keys are errors. data.vocab_size sets model.config.vocab_size.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger

from data.datamodule import TextDataModule
from lightning_modules.language_model import LanguageModel
from lightning_modules.step_timer import StepTimer


@dataclass
class LoggingConfig:
    """Where metrics go. With wandb installed: an offline wandb run (sync later with `wandb sync`)
    beside a CSV log; without wandb: the CSV log alone, with a warning."""

    wandb: bool = True
    project: str = "mamba2-cutile"
    name: str | None = None
    online: bool = False


def make_loggers(cfg: LoggingConfig, root_dir: str) -> list[Logger]:
    loggers: list[Logger] = []
    if cfg.wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            warnings.warn(
                "wandb is not installed: logging to CSV only (pip install wandb for dashboards)", stacklevel=2
            )
        else:
            from lightning.pytorch.loggers import WandbLogger

            loggers.append(WandbLogger(project=cfg.project, name=cfg.name, save_dir=root_dir, offline=not cfg.online))
    loggers.append(CSVLogger(save_dir=root_dir, name="csv"))
    return loggers


class TrainCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(StepTimer, "step_timer")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.every_n_train_steps": 100,
                "checkpoint.save_last": True,
                "checkpoint.save_top_k": 1,
                "checkpoint.monitor": "val/loss",
                "checkpoint.filename": "step{step}-val{val/loss:.3f}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_class_arguments(LoggingConfig, "logging")
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="checkpoint to resume from, or 'last'")
        parser.link_arguments("data.vocab_size", "model.config.vocab_size")

    def before_instantiate_classes(self) -> None:
        cfg = self.config
        root = cfg.trainer.default_root_dir or "runs/default"
        cfg.trainer.default_root_dir = root
        if cfg.checkpoint.dirpath is None:
            cfg.checkpoint.dirpath = str(Path(root) / "checkpoints")

    def instantiate_trainer(self, **kwargs):
        trainer_cfg = self._get(self.config_init, "trainer")
        if trainer_cfg.get("logger") in (None, True):
            kwargs["logger"] = make_loggers(self.config_init.logging, trainer_cfg["default_root_dir"])
        return super().instantiate_trainer(**kwargs)


def main(args: list[str] | None = None) -> TrainCLI:
    torch.set_float32_matmul_precision("high")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli = TrainCLI(
        LanguageModel,
        TextDataModule,
        run=False,
        args=args,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"precision": "bf16-mixed" if torch.cuda.is_available() else "32-true"},
        seed_everything_default=1234,
        parser_kwargs={"description": __doc__},
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
    return cli


if __name__ == "__main__":
    main()
