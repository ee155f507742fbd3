"""bench.first_step runs train.py as a user does, per variant: a one-step run on empty caches, then a steady run,
and records both with the step timer's figures."""

from __future__ import annotations

import json

import pytest

from bench import first_step
from tests.helpers import tiny_args


def test_first_step_records_the_wait_and_the_steady_step(tmp_path, corpus, data_cache):
    train_args = tiny_args(tmp_path / "unused", corpus, cache_dir=data_cache)[2:]  # without its --config
    out = tmp_path / "first.json"
    argv = ["--config", "configs/tiny.yaml", "--variants", "torch:reference", "--steps", "6", "--out", str(out)]
    argv += ["--work", str(tmp_path / "work")]
    assert first_step.main([*argv, "--", *train_args, "--step_timer.warmup_steps=1"]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "first_step" and data["settings"]["steps"] == 6 and "torch" in data["environment"]
    (record,) = data["records"]
    first, steady = record["first"], record["steady"]
    assert record["variant"] == "torch:reference" and first["exit_code"] == steady["exit_code"] == 0
    # the wait is the process's own, from its start: more than the step, less than the whole process
    assert 0 < first["first_step_s"] < first["process_s"]
    assert steady["steady_steps"] == 5 and steady["time/step_ms"] > 0
    kept = tmp_path / "work" / "torch-reference"  # --work keeps the runs and their logs
    assert (kept / "steady" / "step_times.json").is_file() and (kept / "first.log").is_file()


def test_first_step_refuses_a_variant_without_its_backward(capsys):
    with pytest.raises(SystemExit) as exit_info:
        first_step.main(["--variants", "cutile"])
    assert exit_info.value.code == 2
    assert "--variants: each is BACKEND:BACKWARD, got 'cutile'" in capsys.readouterr().err
