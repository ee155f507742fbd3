"""BENCHMARKS.md's training-curves section renders bench/curves.py's JSON: one row per run, validation losses by
step, a failed run's exit shown; its plot is a small PNG written beside the JSON."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from bench.report.curves import curves_plot, curves_section, tail_mean
from tests.bench.report.synthetic import report_beside_minimal_series, write
from tests.bench.report.test_boundaries_section import ENV


def data() -> dict:
    """Two runs of 100 steps, logged every 10, validated at 50 and 100; and a run that failed before validating."""
    train = [[s, 5.0 - s / 100] for s in range(0, 100, 10)]
    runs = [
        {
            "label": "boundaries",
            "args": ["--data.document_boundaries=true"],
            "exit_code": 0,
            "process_s": 100.0,
            "steady": {"time/step_ms": 48.226, "throughput/tokens_per_s": 340_000.0, "steady_steps": 90},
            "train_loss": train,
            "val_loss": [[50, 4.5], [100, 4.0]],
        },
        {
            "label": "packed",
            "args": ["--data.document_boundaries=false", "--seed=1"],
            "exit_code": 0,
            "process_s": 90.0,
            "steady": {"time/step_ms": 47.5, "steady_steps": 90},
            "train_loss": [[s, v + 0.1] for s, v in train],
            "val_loss": [[50, 4.6]],
        },
        {"label": "broken", "args": ["--x=1"], "exit_code": 1, "process_s": 5.0, "steady": {}},
    ]
    settings = {"config": "configs/medium.yaml", "steps": 100, "train_args": ["--trainer.val_check_interval=50"]}
    return {"kind": "curves", "settings": settings, "environment": ENV, "records": runs}


def test_each_run_is_a_row_with_validation_losses_by_step():
    text = curves_section(data(), Path("results/c.json"), "results/c.png")
    assert "c.json" in text and "configs/medium.yaml" in text and "100 steps" in text and "NVIDIA H200" in text
    assert "--run packed=--data.document_boundaries=false,--seed=1" in text
    assert "-- --trainer.val_check_interval=50`" in text
    assert "| val loss @ 50 | val loss @ 100 |" in text
    assert "| boundaries | `--data.document_boundaries=true` | 0 | 48.23 | 340k | 4.100 | 4.500 | 4.000 |" in text
    assert "| 0 | 47.50 | — | 4.200 | 4.600 | — |" in text
    assert "| broken | `--x=1` | 1 | — | — | — | — | — |" in text
    assert text.endswith("![c](results/c.png)")


def test_training_loss_is_the_mean_of_the_last_tenth_of_logged_steps():
    assert tail_mean([]) is None
    assert tail_mean([[0, 3.0], [1, 2.0]]) == 2.0  # at least one point
    points = [[s, float(s)] for s in range(20)]
    assert tail_mean(points) == 18.5  # the last 2 of 20


def test_plot_is_a_small_png(tmp_path):
    path = curves_plot(data(), tmp_path / "c.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (600, 350)


def test_report_renders_the_section_and_its_plot_when_the_json_is_present(tmp_path):
    text, _ = report_beside_minimal_series(tmp_path, "--curves", "c")
    assert "## Training curves" not in text and not (tmp_path / "c.png").exists()
    write(tmp_path / "c.json", data())
    text, stdout = report_beside_minimal_series(tmp_path, "--curves", "c")
    assert "## Training curves (bench/curves.py, c.json)" in text and text.endswith("![c](c.png)\n")
    assert (tmp_path / "c.png").is_file() and "c.png" in stdout
