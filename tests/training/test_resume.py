"""Stopping and resuming: a run stopped at any moment (Ctrl-C, kill -9, a crash, a NaN loss) resumes with
--ckpt_path last into the same run, the same logs and the same numbers as a run never stopped."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from lightning_modules.checkpoint import read_checkpoint
from tests.helpers import ROOT, read_metrics, series, subprocess_env, tiny_args, wandb_records

STEPS = 150  # far more than the 5 stops below reach (6 steps each at most): every stop lands in training
# A checkpoint every 2 steps, validation every 6: stops land in steps, in checkpoint writes and in validations.
RUN = (f"--trainer.max_steps={STEPS}", "--checkpoint.every_n_train_steps=2", "--logging.wandb=false")


def _logged_steps(root: Path) -> int:
    """How many training steps the CSV log holds (it is written after every step); 0 while there is none."""
    try:
        return len(series(read_metrics(root), "train/loss"))
    except (FileNotFoundError, IndexError, ValueError, KeyError):
        return 0


def _stop_at_a_random_moment(
    args: list[str], root: Path, rng: random.Random, sig: int, at_least: int = 1
) -> subprocess.CompletedProcess:
    """Start train.py, let it train `at_least` to 6 steps beyond what the log held, then signal it within the
    next step or so: mid-step, mid-checkpoint or mid-validation."""
    target = _logged_steps(root) + rng.randint(at_least, 6)
    proc = subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while proc.poll() is None and _logged_steps(root) < target and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.05))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.slow  # five processes started and stopped: the slow tier; the default one resumes from a crash below
def test_stopped_at_random_moments_resumes_to_the_same_weights_and_losses(tmp_path, corpus, data_cache):
    reference = tmp_path / "uninterrupted"
    train.main(tiny_args(reference, corpus, *RUN, cache_dir=data_cache))

    seed = random.SystemRandom().randrange(2**32)  # not the random module: training seeds it
    rng = random.Random(seed)
    root = tmp_path / "stopped"
    first = tiny_args(root, corpus, *RUN, cache_dir=data_cache)
    resume = [*first, "--ckpt_path=last"]

    # Ctrl-C after the first checkpoint (step 2): a graceful stop, one line, exit 130.
    stopped = _stop_at_a_random_moment(first, root, rng, signal.SIGINT, at_least=3)
    assert stopped.returncode == 130, f"seed {seed}: {stopped.stderr[-3000:]}"
    assert stopped.stderr.strip().splitlines()[-1].startswith("train.py: error: interrupted at step")
    last = root / "checkpoints" / "last.ckpt"
    logged, saved = _logged_steps(root), read_checkpoint(last, mmap=True)["global_step"]
    assert logged - saved <= 2, f"seed {seed}: the last checkpoint (step {saved}) trails step {logged}"
    # Then kill -9, several times in a row, each run resumed from `last`, whose checkpoint is at most 2 steps old.
    resumed_from = []
    for _ in range(4):
        resumed_from.append(read_checkpoint(last, mmap=True)["global_step"])
        stopped = _stop_at_a_random_moment(resume, root, rng, signal.SIGKILL)
        assert stopped.returncode == -signal.SIGKILL, f"seed {seed}: the run ended before it was killed"
        logged, saved = _logged_steps(root), read_checkpoint(last, mmap=True)["global_step"]
        assert logged - saved <= 2, f"seed {seed}: the last checkpoint (step {saved}) trails step {logged}"
    train.main(resume)
    assert len(set(resumed_from)) >= 2, f"seed {seed}: kills resumed from {resumed_from} only"

    expected, got = (
        read_checkpoint(reference / "checkpoints" / "last.ckpt"),
        read_checkpoint(root / "checkpoints" / "last.ckpt"),
    )
    assert got["global_step"] == expected["global_step"] == STEPS
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][name], tensor), f"seed {seed}: {name}"
    # One CSV log, every step once, the same losses (steps a killed run logged after its checkpoint were redone).
    assert [p.name for p in (root / "csv").iterdir()] == ["version_0"]
    ref_rows, rows = read_metrics(reference), read_metrics(root)
    for key in ("train/loss", "val/loss"):
        assert series(rows, key) == series(ref_rows, key), f"seed {seed}: {key}"
    assert sorted(series(rows, "train/loss")) == list(range(STEPS))


def test_resumed_run_continues_its_wandb_run_and_csv_log(tmp_path, corpus, data_cache):
    from wandb.proto import wandb_internal_pb2 as pb

    crash = ["--trainer.callbacks+=tests.helpers.InterruptAt", "--trainer.callbacks.step=10"]
    with pytest.raises(SystemExit) as failed:
        train.main(tiny_args(tmp_path, corpus, *crash, cache_dir=data_cache))
    assert failed.value.code == 1
    assert read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 8
    train.main(tiny_args(tmp_path, corpus, "--ckpt_path=last", cache_dir=data_cache))

    runs = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2, runs
    ids, steps = [], []
    for path in runs:
        history = []
        for data in wandb_records(path):
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.append(record.run.run_id)
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                if "train/loss" in items:
                    history.append(int(items["trainer/global_step"]))
        steps.append(history)
    assert ids[0] == ids[1], "the resumed run must continue the same wandb run"
    assert steps[0] == list(range(10)) and steps[1] == list(range(8, 12)), steps
    assert [p.name for p in (tmp_path / "csv").iterdir()] == ["version_0"]
    assert sorted(series(read_metrics(tmp_path), "train/loss")) == list(range(12))


def test_a_nan_loss_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path, corpus, data_cache, capsys):
    poison = ("--trainer.callbacks+=tests.helpers.PoisonAt", "--trainer.callbacks.step=10", "--logging.wandb=false")
    with pytest.raises(SystemExit) as failed:
        train.main(tiny_args(tmp_path, corpus, *poison, cache_dir=data_cache))
    assert failed.value.code == 1
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith("train.py: error: non-finite training loss") and "--ckpt_path last" in last_line
    assert read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 8
