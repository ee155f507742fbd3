"""bench.wandb_panels reads an offline wandb run's own file back, row by row, and draws its panels."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import wandb_panels

pytest.importorskip("wandb")


def offline_run(root, rows: list[dict]):
    """An offline wandb run logging `rows`, made in a process of its own: wandb.init leaves global state behind
    (its setup singleton) that would change later in-process runs of train.py."""
    script = (
        "import json, sys, wandb\n"
        "run = wandb.init(mode='offline', dir=sys.argv[1], project='p', settings=wandb.Settings(silent=True))\n"
        "for row in json.loads(sys.stdin.read()):\n    run.log(row)\nrun.finish()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(root)], input=json.dumps(rows), text=True, check=True)
    (folder,) = (root / "wandb").glob("offline-run-*")
    return folder


def test_history_reads_back_every_logged_row_and_renders(tmp_path):
    # enough rows to cross the log's 32 KiB blocks, so records split over blocks are joined
    rows = [{"trainer/global_step": i, "time/step_ms": 50.0 + i % 3, "train/loss": 10.0 / (i + 1)} for i in range(600)]
    rows += [{"trainer/global_step": 600, "note": "x" * 40000}]  # one record longer than a block
    folder = offline_run(tmp_path, rows)
    assert (folder / next(folder.glob("run-*.wandb")).name).stat().st_size > 2 * wandb_panels.BLOCK
    back = wandb_panels.history(folder)
    assert [{k: r[k] for k in row} for r, row in zip(back, rows)] == rows and len(back) == len(rows)
    steps, values = wandb_panels.series(back, "time/step_ms", skip=5)
    assert steps == list(range(5, 600)) and values[0] == 52.0
    out = tmp_path / "panels.png"
    assert wandb_panels.main([f"{folder}:a run", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_a_folder_without_a_run_file_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "junk.wandb").write_bytes(b"not a run")
    with pytest.raises(SystemExit):
        wandb_panels.main([f"{tmp_path / 'empty'}:x"])
    assert "no run-*.wandb in" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a wandb run file"):
        wandb_panels.records(tmp_path / "junk.wandb")
