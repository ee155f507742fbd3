"""Where metrics go, and how a resumed run keeps writing into the same logs.

LoggingConfig        the `logging:` section of train.py
make_loggers         an offline (or online) wandb run beside a CSV log; on resume, the same wandb run (same
                     id) and the same CSV version, continued from the restored step; nothing is written
                     before the run starts
ContinuedCSVLogger   a CSVLogger that keeps the rows of the steps before the restored one
LoggedRun            a callback that writes the loggers' ids into every checkpoint (plain data), where a
                     resume finds them
"""

from __future__ import annotations

import csv
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

LOGGED_RUN_KEY = "logged_run"  # checkpoint entry: {"wandb": run id or None, "csv": version or None}


@dataclass
class LoggingConfig:
    """Where metrics go. With wandb installed: an offline wandb run (sync later with `wandb sync`)
    beside a CSV log; without wandb: the CSV log alone, with a warning."""

    wandb: bool = True
    project: str = "mamba2-cutile"
    name: str | None = None
    online: bool = False


class _ContinuedWriter(ExperimentWriter):
    """The CSV writer of a resumed run: the existing metrics.csv keeps its rows of steps before `start_step`
    (the resumed run logs the later ones again) instead of being deleted."""

    def __init__(self, log_dir: str, start_step: int):
        self.start_step = start_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            kept = [row for row in reader if row.get("step") and int(float(row["step"])) < self.start_step]
        tmp = path.with_name(path.name + ".partial")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(tmp, path)
        self.metrics_keys = keys


class RootedWandbLogger(WandbLogger):
    """A WandbLogger that creates its save_dir when its run starts (wandb warns about a missing git root when the
    folder is not there yet), not before: a run refused while it is being configured leaves no folder behind. It
    passes wandb.init no `anonymous`: Lightning passes None, and wandb 0.31 warns that the setting has no effect
    whenever it is given."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None and self.save_dir is not None:
            Path(self.save_dir).mkdir(parents=True, exist_ok=True)
        return super().experiment


class ContinuedCSVLogger(CSVLogger):
    """CSVLogger writing into an existing version, continuing its metrics.csv from `start_step`."""

    def __init__(self, save_dir: str, name: str, version: int, start_step: int):
        super().__init__(save_dir=save_dir, name=name, version=version)
        self.start_step = start_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuedWriter(self.log_dir, self.start_step)
        return self._experiment


def make_loggers(cfg: LoggingConfig, root_dir: str, resumed: dict | None = None, start_step: int = 0) -> list[Logger]:
    """The run's loggers under `root_dir`.

    Args:
        resumed: the LOGGED_RUN_KEY entry of the checkpoint a run resumes from; its wandb run and CSV
            version are continued (wandb history and CSV rows continue at `start_step`).
        start_step: the restored global step.
    """
    resumed = resumed or {}
    loggers: list[Logger] = []
    if cfg.wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            warnings.warn(
                "wandb is not installed: logging to CSV only (pip install wandb for dashboards)", stacklevel=2
            )
        else:
            run_id = resumed.get("wandb")
            loggers.append(
                RootedWandbLogger(
                    project=cfg.project,
                    name=cfg.name,
                    save_dir=root_dir,
                    offline=not cfg.online,
                    id=run_id,
                    resume="allow" if run_id else None,
                )
            )
    version = resumed.get("csv")
    if version is None:
        loggers.append(CSVLogger(save_dir=root_dir, name="csv"))
    else:
        loggers.append(ContinuedCSVLogger(save_dir=root_dir, name="csv", version=int(version), start_step=start_step))
    return loggers


def finish_loggers(loggers: list[Logger], failed: bool) -> None:
    """End the wandb run (marked failed or finished), so that a later run in this process starts its own, and
    wait until its files are written: `finish` returns while wandb's service may still be writing the run's
    .wandb file (a reader in this process could see a torn record), so the service is shut down too (the next
    run starts a new one)."""
    finished = False
    for logger in loggers:
        experiment = getattr(logger, "_experiment", None)
        if isinstance(logger, WandbLogger) and experiment is not None and hasattr(experiment, "finish"):
            experiment.finish(exit_code=1 if failed else 0)
            finished = True
    if finished:
        import wandb

        wandb.teardown()


class LoggedRun(Callback):
    """Writes the ids of the run's wandb run and CSV version into every checkpoint, as plain data."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        ids: dict[str, str | int | None] = {"wandb": None, "csv": None}
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                ids["csv"] = int(logger.version)
            elif isinstance(logger, WandbLogger) and logger.version is not None:
                ids["wandb"] = str(logger.version)
        checkpoint[LOGGED_RUN_KEY] = ids
