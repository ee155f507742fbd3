"""Checkpoints that cover every step, are written whole, and open without running anyone's code.

StepCheckpoint      the `checkpoint:` callback of train.py: a checkpoint every N training steps whether or
                    not a validation has run, one when training ends, `last.ckpt` always the newest; each
                    name carries the training loss of the step it was written at
AtomicCheckpointIO  writes each checkpoint to a temporary file beside it and renames it into place, so a
                    kill never leaves a truncated checkpoint; reads through read_checkpoint
read_checkpoint     loads tensors and plain data only (never pickled objects, which could run code), with
                    one-line errors for a missing file, a file that is no checkpoint, or an unsafe one
check_same_model    names the tensors and settings in which a checkpoint's model differs from this one
load_trained        the trained LightningModule and its tokenizer, from a checkpoint alone
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import signal
import threading
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from tokenizers import Tokenizer

from lightning_modules.language_model import LanguageModel

PARTIAL_SUFFIX = ".partial"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here; the message names the file, the problem and the fix."""


def read_checkpoint(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> dict:
    """The checkpoint at `path` as a dict, loaded as tensors and plain data only.

    mmap=True maps the tensors instead of reading them (cheap when only shapes or small entries are needed).
    Raises CheckpointError (one line, naming the file) when the file is missing, is no PyTorch checkpoint,
    holds a pickled object that would run code when loaded, or holds no model weights.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not exist; give the path of a .ckpt file written by train.py"
        )
    if path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is a directory; give a .ckpt file in it (e.g. last.ckpt)")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint: train.py writes PyTorch zip archives and this file is not one "
            "(empty, cut short, or another format)"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        unsafe = re.search(r"GLOBAL (\S+)", str(err))
        if unsafe:
            raise CheckpointError(
                f"refusing to open {str(path)!r}: it holds a pickled Python object ({unsafe.group(1)}) that could "
                "run code when loaded; train.py writes only tensors and plain data, so this file did not come from "
                "it unaltered. Use a checkpoint written by train.py"
            ) from None
        raise CheckpointError(f"{str(path)!r} is damaged or was not written by train.py (unreadable content)") from None
    except Exception as err:
        raise CheckpointError(
            f"{str(path)!r} is damaged or was not written by train.py (reading it failed: {type(err).__name__})"
        ) from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(
            f"{str(path)!r} holds no model weights (no 'state_dict'); give a .ckpt file written by train.py"
        )
    return checkpoint


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and dataclass-like objects flattened to dotted keys."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if hasattr(v, "__dataclass_fields__"):
            v = {f: getattr(v, f) for f in v.__dataclass_fields__}
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_same_model(checkpoint: dict, module: torch.nn.Module, path: str | Path) -> None:
    """Raise CheckpointError if `checkpoint` holds another model than `module` (other tensor names or shapes).

    The message names the first differing tensor, how many differ, and the hyperparameters that differ.
    """
    saved, here = checkpoint["state_dict"], module.state_dict()
    differing = [k for k in here if k in saved and tuple(saved[k].shape) != tuple(here[k].shape)]
    missing, extra = [k for k in here if k not in saved], [k for k in saved if k not in here]
    if not (differing or missing or extra):
        return
    if differing:
        k = differing[0]
        first = f"{k} is {tuple(saved[k].shape)} there, {tuple(here[k].shape)} here"
    elif missing:
        first = f"it lacks {missing[0]}"
    else:
        first = f"it holds {extra[0]}, which this model has not"
    n = len(differing) + len(missing) + len(extra)
    hparams = getattr(module, "hparams", None)
    settings = ""
    if hparams is not None and isinstance(checkpoint.get("hyper_parameters"), dict):
        there, now = _flat(checkpoint["hyper_parameters"]), _flat(dict(hparams))
        diff = [f"{k} {there[k]} there, {now[k]} here" for k in sorted(there.keys() & now.keys()) if there[k] != now[k]]
        settings = f"; settings that differ: {', '.join(diff)}" if diff else ""
    raise CheckpointError(
        f"checkpoint {str(path)!r} holds another model: {first} ({n} tensor(s) differ{settings}). "
        "Resume with the model settings that wrote it, or drop --ckpt_path to start a fresh run"
    )


def load_trained(path: str | Path, device: str | torch.device = "cpu") -> tuple[LanguageModel, Tokenizer]:
    """The LightningModule (eval mode, on `device`) and the tokenizer stored in a checkpoint written by train.py."""
    checkpoint = read_checkpoint(path, mmap=True)
    tokenizer_json = (checkpoint.get("TextDataModule") or {}).get("tokenizer_json")
    if not isinstance(tokenizer_json, str) or not isinstance(checkpoint.get("hyper_parameters"), dict):
        raise CheckpointError(
            f"checkpoint {str(path)!r} carries no tokenizer or no model settings; give a .ckpt file written by train.py"
        )
    module = LanguageModel.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    return module.to(device).eval(), Tokenizer.from_str(tokenizer_json)


@contextlib.contextmanager
def _ctrl_c_deferred():
    """Hold back Ctrl-C (SIGINT) until the block is done, then deliver it: a checkpoint is not cut mid-write."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list = []
    previous = signal.signal(signal.SIGINT, lambda *args: received.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(*received[0])


class AtomicCheckpointIO(TorchCheckpointIO):
    """Local checkpoints written whole or not at all: each is written beside its place and renamed into it
    (Ctrl-C waits for the write). Inside `held()` the renames wait for `commit()`. Every checkpoint is read
    through read_checkpoint."""

    def __init__(self):
        super().__init__()
        self._pending: list[tuple[Path, Path]] | None = None

    @contextlib.contextmanager
    def held(self):
        """Checkpoints saved in this block are written now and put in place by the next commit()."""
        self._pending = self._pending or []
        try:
            yield
        finally:
            if not self._pending:
                self._pending = None

    def commit(self) -> None:
        """Put the held checkpoints in place, in the order they were saved."""
        pending, self._pending = self._pending or [], None
        for partial, path in pending:
            os.replace(partial, path)

    def save_checkpoint(self, checkpoint: dict, path, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + PARTIAL_SUFFIX)
        with _ctrl_c_deferred():
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            if self._pending is not None:
                self._pending.append((partial, path))
            else:
                os.replace(partial, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only=True)
        return read_checkpoint(path, map_location if map_location is not None else "cpu")


class StepCheckpoint(ModelCheckpoint):
    """A checkpoint every `every_n_train_steps` training steps and at the end of training.

    Saved whether or not a validation has run (no monitored metric), so a run stopped at any moment keeps
    one at most `every_n_train_steps` old. `last.ckpt` is always the newest. Names carry the training loss
    of the step they were written at: `filename` may use {step} and any metric logged at that step.

    A checkpoint is in place only once the metrics of its last step are in the logs, so a resume from it
    never leaves a step unlogged: after a validation that follows the step, or, with AtomicCheckpointIO,
    written at the step's end and put in place when the next step starts.
    """

    def __init__(
        self,
        every_n_train_steps: int = 100,
        dirpath: str | None = None,
        filename: str = "step{step}-loss{train/loss:.3f}",
        keep_all: bool = False,
    ):
        """
        Args:
            every_n_train_steps: steps between checkpoints.
            dirpath: where they go; train.py sets <trainer.default_root_dir>/checkpoints.
            filename: name of each step checkpoint, without .ckpt.
            keep_all: keep every step checkpoint, not only the newest (last.ckpt is always kept).
        """
        if every_n_train_steps < 1:
            raise ValueError(f"checkpoint.every_n_train_steps must be at least 1, got {every_n_train_steps}")
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=None,
            save_last=True,
            save_top_k=-1 if keep_all else 1,
            every_n_train_steps=every_n_train_steps,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        )
        self._after_validation = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath and "://" not in str(self.dirpath) and Path(self.dirpath).is_dir():
            for stale in Path(self.dirpath).glob(f"*{PARTIAL_SUFFIX}"):  # left by a run killed mid-write
                stale.unlink(missing_ok=True)

    @staticmethod
    def _io(trainer) -> AtomicCheckpointIO | None:
        io = trainer.strategy.checkpoint_io
        return io if isinstance(io, AtomicCheckpointIO) else None

    @staticmethod
    def _validation_follows(trainer) -> bool:
        """Whether a validation runs right after this training step (Lightning's own test, side-effect free)."""
        loop = trainer.fit_loop.epoch_loop
        return bool(trainer.enable_validation) and loop._should_check_val_fx(trainer.fit_loop._data_fetcher)

    def _save(self, trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Lightning logs this step's metrics right after this hook. A validation due now runs first: the save
        # waits for its end, so the checkpoint records it as done and its results are in the logs.
        if trainer.global_step % self._every_n_train_steps == 0 and self._validation_follows(trainer):
            self._after_validation = True
            return
        io = self._io(trainer)
        if io is None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        with io.held():  # written now, put in place when the next step starts
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._after_validation = False
        if io := self._io(trainer):
            io.commit()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._after_validation and not trainer.sanity_checking:
            self._after_validation = False
            self._save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        """The end of training always writes a checkpoint of the final step (unless one was just written)."""
        if io := self._io(trainer):
            io.commit()
        self._after_validation = False
        self._save(trainer)
