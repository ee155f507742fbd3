"""Train the Mamba-2 language model. The YAML is the whole experiment:

    python train.py --config configs/tiny.yaml
    python train.py --config configs/tiny.yaml --ckpt_path last              # resume
    python train.py --config configs/small.yaml --model.config.ssd_backend cutile --trainer.devices 2 --trainer.strategy ddp
    python train.py --help                                                   # every key

Keys: trainer.* (Lightning Trainer), model.* (lightning_modules.language_model.LanguageModel), data.*
(data.datamodule.TextDataModule), step_timer.* (lightning_modules.step_timer.StepTimer), checkpoint.*
(lightning_modules.checkpoint.StepCheckpoint), logging.* (loggers), ckpt_path. Unknown keys are errors.
data.vocab_size sets model.config.vocab_size.

--ckpt_path last resumes from <checkpoint.dirpath>/last.ckpt and stops (exit 2) when there is none;
a resumed run continues the same wandb run and CSV log. A configuration that cannot run here (a model
that does not fit together, a backend this machine lacks, a corpus that is not there) is refused before
anything is written: no run folder, logs or data cache. An error ends in one line on stderr: exit
code 2 when nothing was trained (configuration, paths, data, checkpoint: fix the input), 1 when a
run failed while training (its checkpoints are kept), 130 on Ctrl-C. --debug (command line only)
shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings
from pathlib import Path


def _fail(message: str, code: int) -> None:
    print(f"train.py: error: {message}", file=sys.stderr)
    raise SystemExit(code)


try:  # the libraries take seconds to load: Ctrl-C meanwhile ends as it does later, in one line
    import torch
    from jsonargparse import ArgumentError, DefaultHelpFormatter, Namespace
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    import kernels
    from data.datamodule import TextDataModule
    from lightning_modules.checkpoint import (
        AtomicCheckpointIO,
        CheckpointError,
        StepCheckpoint,
        check_same_model,
        read_checkpoint,
    )
    from lightning_modules.language_model import LanguageModel, release_compiled_graphs
    from lightning_modules.loggers import LOGGED_RUN_KEY, LoggedRun, LoggingConfig, finish_loggers, make_loggers
    from lightning_modules.step_timer import StepTimer
    from model.mamba2 import Mamba2Config, check_layer_backends
except KeyboardInterrupt:
    _fail("interrupted before training began", 130)

DEBUG_FLAG = "--debug"


class HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the module docstring's lines (its examples) as written."""


class GracefulStop(Callback):
    """Ctrl-C while training stops the run at the next step boundary, once the checkpoints written so far
    are in place (a second Ctrl-C stops at once). Also records whether training began: an error before
    that is a usage error."""

    def __init__(self):
        self.started = False
        self.requested = False
        self._previous = None

    def _on_sigint(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous)  # a second Ctrl-C interrupts at once

    def on_train_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._previous = signal.default_int_handler if previous is None else previous

    def _restore(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _stop_if_requested(self) -> None:
        if self.requested:
            self.requested = False
            raise KeyboardInterrupt

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.started = True  # runs after StepCheckpoint (callbacks added last) has put the last checkpoint in place
        self._stop_if_requested()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop_if_requested()

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore()


def training_device(accelerator) -> torch.device:
    """The device the Trainer trains on for `trainer.accelerator`: the GPU where torch sees one and the accelerator
    is "auto", "gpu" or "cuda" (or given as a class, as "auto"), else the CPU."""
    name = accelerator if isinstance(accelerator, str) else "auto"
    return torch.device("cuda" if name in ("auto", "gpu", "cuda") and torch.cuda.is_available() else "cpu")


def check_config(cfg: Namespace) -> None:
    """Raise ValueError naming the first setting of the parsed configuration that cannot run here: the model's
    sizes and choices (Mamba2Config.validate: the cuTile backward with another SSD backend, say), the bench's
    standin SSD, an SSD backend
    other than auto that the training device cannot run, a cuTile conv or norm where cuTile cannot run. Runs
    before any class is instantiated; the data settings are checked next, by TextDataModule, also before the
    Trainer and its loggers exist. A refused configuration leaves nothing behind."""
    model = cfg.model.config
    config = Mamba2Config(**model.as_dict())
    try:
        config.validate()
    except ValueError as err:
        raise ValueError(f"model.config: {err}") from None
    if model.ssd_backend == "standin":
        raise ValueError(
            "model.config.ssd_backend 'standin' replaces the SSD by y = x·D to time the rest of a step (bench/); "
            "it trains no model: use auto, cutile, triton or torch"
        )
    device = training_device(cfg.trainer.accelerator)
    if model.ssd_backend != "auto" and (reason := kernels.unavailable_reason(model.ssd_backend, device)):
        raise ValueError(
            f"model.config.ssd_backend {model.ssd_backend!r} cannot run here: {reason}; use ssd_backend auto or torch"
        )
    check_layer_backends(config, device)


class TrainCLI(LightningCLI):
    resume_path: str | None = None
    resume_step: int | None = None

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(StepTimer, "step_timer")
        parser.add_lightning_class_args(StepCheckpoint, "checkpoint")
        parser.add_class_arguments(LoggingConfig, "logging")
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="checkpoint to resume from, or 'last' (<checkpoint.dirpath>/last.ckpt; an error if there is none)",
        )
        parser.link_arguments("data.vocab_size", "model.config.vocab_size")

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        # main() hands over the command line itself (less --debug): Lightning's warning about `args` given
        # beside sys.argv does not apply.
        self.config = parser.parse_args(args)

    def before_instantiate_classes(self) -> None:
        cfg = self.config
        check_config(cfg)
        root = cfg.trainer.default_root_dir or "runs/default"
        cfg.trainer.default_root_dir = root
        if cfg.checkpoint.dirpath is None:
            cfg.checkpoint.dirpath = str(Path(root) / "checkpoints")

    def _read_resume_checkpoint(self) -> dict | None:
        """The checkpoint named by --ckpt_path, read and checked against the model before anything runs."""
        spec = self.config.ckpt_path
        if not spec:
            return None
        path = Path(self.config.checkpoint.dirpath) / "last.ckpt" if spec == "last" else Path(spec)
        if spec == "last" and not path.is_file():
            raise CheckpointError(
                f"--ckpt_path last: no checkpoint to resume in {str(path.parent)!r} (no last.ckpt); "
                "drop --ckpt_path to start a fresh run, or point checkpoint.dirpath (default "
                "<trainer.default_root_dir>/checkpoints) at the run to resume"
            )
        checkpoint = read_checkpoint(path, mmap=True)
        check_same_model(checkpoint, self.model, path)
        self.resume_path, self.resume_step = str(path), int(checkpoint.get("global_step", 0))
        return checkpoint

    def instantiate_trainer(self, **kwargs):
        checkpoint = self._read_resume_checkpoint()
        trainer_cfg = self._get(self.config_init, "trainer")
        if trainer_cfg.get("logger") in (None, True):
            kwargs["logger"] = make_loggers(
                self.config_init.logging,
                trainer_cfg["default_root_dir"],
                resumed=checkpoint.get(LOGGED_RUN_KEY) if checkpoint else None,
                start_step=self.resume_step or 0,
            )
        plugins = trainer_cfg.get("plugins") or []
        kwargs["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), AtomicCheckpointIO()]
        trainer = super().instantiate_trainer(**kwargs)
        self.stop = GracefulStop()
        trainer.callbacks.extend([self.stop, LoggedRun()])
        return trainer


def _one_line(err: BaseException) -> str:
    """The error as one line: a short message joined; a long one (jsonargparse's union errors) cut to its first
    line and its innermost, most specific lines."""
    text = str(err).strip() or type(err).__name__
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    joined = " ".join(line.strip() for line in lines)
    if len(joined) > 300 and len(lines) > 1:
        depth = max(len(line) - len(line.lstrip()) for line in lines[1:])
        deepest = dict.fromkeys(line.strip() for line in lines[1:] if len(line) - len(line.lstrip()) == depth)
        joined = f"{lines[0].strip()} {'; '.join(deepest)} (the whole message: rerun with {DEBUG_FLAG})"
    if not isinstance(err, (ValueError, RuntimeError, OSError, ArithmeticError, ArgumentError)):
        joined = f"{type(err).__name__}: {joined}"
    return joined


def _resume_hint(cli: TrainCLI) -> str:
    """Where the newest checkpoint of this run is, and how to continue from it."""
    last = Path(cli.config.checkpoint.dirpath) / "last.ckpt"
    try:
        step = read_checkpoint(last, mmap=True)["global_step"]
    except CheckpointError:
        return "No checkpoint was written yet."
    return f"The last checkpoint ({last}, step {step}) is intact: resume with --ckpt_path last."


def main(args: list[str] | None = None) -> TrainCLI:
    """Parse, build and train. Errors end in one line on stderr and SystemExit (see the module docstring)."""
    argv = list(sys.argv[1:] if args is None else args)
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    torch.set_float32_matmul_precision("high")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        cli = TrainCLI(
            LanguageModel,
            TextDataModule,
            run=False,
            args=argv,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"precision": "bf16-mixed" if torch.cuda.is_available() else "32-true"},
            seed_everything_default=1234,
            parser_kwargs={"description": __doc__, "exit_on_error": False, "formatter_class": HelpFormatter},
            auto_configure_optimizers=False,  # the optimizer and schedule are LanguageModel's (model.lr, ...)
        )
    except KeyboardInterrupt:
        _fail("interrupted before training began", 130)
    except Exception as err:
        if debug:
            raise
        hint = "; `python train.py --help` lists every key" if isinstance(err, ArgumentError) else ""
        _fail(f"{_one_line(err)}{hint}", 2)
    finished, outcome = False, None
    try:
        with warnings.catch_warnings():
            # Lightning 2.6's own use of torch's pytree under torch >= 2.13: nothing a user can act on
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
            if cli.resume_path:  # a resumed run writes into its own checkpoint directory: nothing to warn about
                warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.resume_path, weights_only=True)
        finished = True
    except SystemExit:
        if not cli.trainer.interrupted:
            raise
        # Ctrl-C: Lightning has shut down gracefully and exits.
        outcome = f"interrupted at step {cli.trainer.global_step}. {_resume_hint(cli)}", 130
    except Exception as err:
        if debug:
            raise
        message = _one_line(err)
        if not cli.stop.started:
            outcome = message, 2
        elif "--ckpt_path" not in message:
            outcome = f"{message.rstrip('.')}. {_resume_hint(cli)}", 1
        else:
            outcome = message, 1
    finally:
        finish_loggers(cli.trainer.loggers, failed=not finished)
    if outcome:
        print(file=sys.stderr)  # a progress bar may have left its line open
        _fail(*outcome)
    return cli


if __name__ == "__main__":
    try:
        main()
    finally:
        release_compiled_graphs()
