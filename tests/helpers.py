"""Shared by the tests: tiny corpora, CSV metric reading, the offline wandb record reader, train.py arguments
and subprocesses, scripts called in-process, callbacks that break a run on purpose."""

from __future__ import annotations

import csv
import functools
import importlib.util
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parent.parent
# The data settings of tiny_args' runs (TextDataModule's arguments): the conftest's data_cache is built with them.
TINY_DATA = {"max_documents": None, "vocab_size": 300, "seq_len": 48, "batch_size": 4, "val_fraction": 0.2}


def stored(value: float):
    """pytest.approx for a figure read back from a results file (bench.results keeps seven significant digits), or
    computed from such figures."""
    return pytest.approx(value, rel=1e-5, abs=1e-4)


def write_corpus(directory: Path, n_files: int = 12, lines: int = 60) -> Path:
    """A small text corpus of Python-like files, deterministic."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        body = "\n".join(
            f"def function_{i}_{j}(value):\n    return value * {j} + {i}  # line {j}\n" for j in range(lines)
        )
        (directory / f"module_{i}.py").write_text(f'"""Module {i}."""\n\n{body}\n')
    return directory


def tiny_args(root: Path, corpus: Path, *extra: str, cache_dir: Path | None = None) -> list[str]:
    """train.py arguments for a seconds-long CPU run on `corpus`, everything under `root`; the data cache (tokenizer,
    tokenized blocks) in `cache_dir` (the conftest's data_cache: built once a session), else a new one in root."""
    data = [f"--data.{key}={'null' if value is None else value}" for key, value in TINY_DATA.items()]
    return [
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        f"--trainer.default_root_dir={root}",
        "--trainer.max_steps=12",
        "--trainer.val_check_interval=6",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--model.config.d_model=32",
        "--model.config.headdim=16",
        "--model.config.d_state=16",
        "--model.config.chunk_size=16",
        "--model.warmup_steps=2",
        f"--data.corpus={corpus}",
        *data,
        f"--data.cache_dir={cache_dir or root / 'cache'}",
        "--checkpoint.every_n_train_steps=4",
        *extra,
    ]


def gpu_model_args(backend: str, backward: str, compile_model: bool, compile_mode: str | None = None) -> list[str]:
    """train.py arguments for the small model the GPU training tests run (kernel-sized dims, 256 tokens);
    compile_mode (a torch.compile mode) needs compile_model."""
    if compile_mode and not compile_model:
        raise ValueError(f"compile_mode {compile_mode!r} without compile_model")
    return [
        f"--model.config.ssd_backend={backend}",
        f"--model.config.ssd_backward={backward}",
        f"--model.compile={str(compile_model).lower()}",
        *([f"--model.compile_mode={compile_mode}"] if compile_mode else []),
        "--model.config.d_model=128",
        "--model.config.headdim=64",
        "--model.config.d_state=64",
        "--model.config.chunk_size=64",
        "--data.seq_len=256",
    ]


def default_sigint() -> None:
    """For `preexec_fn`: SIGINT at its default in the child, as a terminal's Ctrl-C finds it. A test run started in
    the background of a non-interactive shell (`pytest &` in a script) has SIGINT ignored, children inherit that,
    and a Ctrl-C test would then send a signal nobody receives."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def subprocess_env(keep_devices: bool = False) -> dict[str, str]:
    """Environment for running the project's entry points as subprocesses: the repository first on the import
    path, then whatever the caller's PYTHONPATH holds (on a GPU machine, packages installed there)."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    if not keep_devices:  # multi-GPU runs see every GPU; a one-GPU test keeps the GPU it was given
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_script(
    script: str, *args: str, timeout: float = 600, keep_devices: bool = False
) -> subprocess.CompletedProcess:
    """`python <script> <args>` from the repository root, output captured (see subprocess_env for keep_devices)."""
    env = subprocess_env(keep_devices)
    return subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@functools.cache
def script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (scripts/ is no package), to call its main(argv) in this process."""
    spec = importlib.util.spec_from_file_location(f"scripts.{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_metrics(root: Path, version: int | None = None) -> list[dict[str, float]]:
    """Rows of the CSV log under root/csv (the latest version unless given), as floats, empty cells dropped."""
    versions = sorted((root / "csv").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    path = (root / "csv" / f"version_{version}" if version is not None else versions[-1]) / "metrics.csv"
    with path.open() as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def series(rows: list[dict[str, float]], key: str) -> dict[int, float]:
    """step -> value for one metric."""
    return {int(r["step"]): r[key] for r in rows if key in r}


def wandb_records(path: Path) -> Iterator[bytes]:
    """The protobuf records of an offline .wandb file (a LevelDB-style log of 32 KiB blocks)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


class InterruptAt(Callback):
    """Stops a run abruptly at a given step, as a crash or a kill would."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash at step {self.step}")


class PoisonAt(Callback):
    """Fills the weights with NaN at a given step, so that its loss is not finite."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                for p in pl_module.parameters():
                    p.fill_(float("nan"))


class DumpWeights(Callback):
    """Writes each rank's final weights to <default_root_dir>/weights_rank{r}.pt."""

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        path = Path(trainer.default_root_dir) / f"weights_rank{trainer.global_rank}.pt"
        torch.save({k: v.detach().cpu() for k, v in pl_module.state_dict().items()}, path)
