"""bench.curves runs train.py once per labelled set of arguments and reads each run's curves back from its CSV log."""

from __future__ import annotations

import json
import math

import pytest

from bench import curves
from tests.helpers import tiny_args


def test_curves_reads_each_runs_losses_and_steady_step(tmp_path, corpus, data_cache):
    train_args = tiny_args(tmp_path / "unused", corpus, cache_dir=data_cache)[2:]  # without its --config
    out = tmp_path / "curves.json"
    argv = ["--config", "configs/tiny.yaml", "--steps", "8", "--out", str(out), "--work", str(tmp_path / "work")]
    argv += ["--run", "on=--data.document_boundaries=true", "--run", "off=--data.document_boundaries=false"]
    extra = [*train_args, "--trainer.max_steps=8", "--trainer.val_check_interval=4", "--step_timer.warmup_steps=1"]
    assert curves.main([*argv, "--", *extra]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "curves" and data["settings"]["steps"] == 8 and "torch" in data["environment"]
    on, off = data["records"]
    assert (on["label"], off["label"]) == ("on", "off") and on["args"] == ["--data.document_boundaries=true"]
    for record in (on, off):
        assert record["exit_code"] == 0 and record["steady"]["steady_steps"] == 7
        assert [step for step, _ in record["train_loss"]] == list(range(8))  # logged every step
        assert len(record["val_loss"]) == 2  # after steps 4 and 8
        assert all(math.isfinite(loss) for _, loss in record["train_loss"] + record["val_loss"])
    # the same data and weights: the runs part only where a document boundary cuts the state
    assert on["train_loss"] != off["train_loss"]


@pytest.mark.parametrize("run", ["nolabel", "=--x=1", "label="])
def test_curves_refuses_a_run_without_label_or_arguments(run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        curves.main(["--run", run])
    assert exit_info.value.code == 2
    assert "--run: a run is LABEL=ARG[,ARG...]" in capsys.readouterr().err


def test_curves_keeps_the_runs_it_finished_when_stopped(tmp_path, monkeypatch):
    """The JSON is rewritten after each run: a process stopped in its second run keeps its first."""
    out = tmp_path / "curves.json"

    def measure(label, run_args, common, work, timeout):
        if label == "second":
            raise KeyboardInterrupt  # what a time limit's signal leaves
        return {"label": label, "args": run_args, "exit_code": 0, "steady": {"time/step_ms": 1.0}}

    monkeypatch.setattr(curves, "measure", measure)
    with pytest.raises(KeyboardInterrupt):
        curves.main(["--run", "first=--a=1", "--run", "second=--a=2", "--out", str(out), "--", "--b=3"])
    data = json.loads(out.read_text())
    assert [r["label"] for r in data["records"]] == ["first"] and data["settings"]["train_args"] == ["--b=3"]
    assert data["kind"] == "curves" and "torch" in data["environment"]
