"""BENCHMARKS.md's long-context section pools bench/curves.py's processes of configs/long.yaml: median [min–max]
of each run's step, tokens/s and memory, triton's step over cuTile's taken within each process, every process's
last loss (a loss that is not finite shows as nan), and nothing when the series is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report.long_context import long_rows, long_section
from bench.report.series import load_series
from tests.bench.report.synthetic import report_beside_minimal_series, write
from tests.bench.report.test_boundaries_section import ENV

SETTINGS = {"config": "configs/long.yaml", "steps": 200, "train_args": ["--data.seq_len=16384"]}


def record(label: str, step_ms: float, reserved: float, last: float, exit_code: int = 0) -> dict:
    steady = {
        "time/step_ms": step_ms,
        "throughput/tokens_per_s": 65536 / step_ms * 1e3,
        "memory/reserved_gib": reserved,
    }
    steady["memory/peak_gib"] = reserved / 2
    loss = [[s, 9.0 - s / 100] for s in range(0, 190, 10)] + [[190, last]]
    return {"label": label, "args": [f"--model.config.ssd_backend={label}"], "exit_code": exit_code,
            "steady": steady, "train_loss": loss, "val_loss": []}  # fmt: skip


def process(cutile_ms: float, triton_ms: float, triton_last: float = 5.0) -> dict:
    records = [record("cutile", cutile_ms, 20.0, 5.5), record("triton", triton_ms, 24.0, triton_last)]
    return {"kind": "curves", "settings": SETTINGS, "environment": ENV, "records": records}


def runs() -> list[dict]:
    made = [process(200.0, 260.0), process(210.0, 252.0), process(190.0, 247.0, float("nan"))]
    return [{**run, "file": Path(f"results/l_run{i}.json")} for i, run in enumerate(made, 1)]


def test_each_variant_is_pooled_over_processes_and_taken_over_cutile_within_each():
    cutile, triton = long_rows("l", runs())
    assert cutile[:4] == ["l", "H200", "--data.seq_len=16384", "200"]  # the series' cells, on its first row
    assert cutile[4:10] == ["cutile", "3", "0 0 0", "200.0 [190.0–210.0]", "328k [312k–345k]", "20.0 [20.0–20.0]"]
    assert cutile[10] == ""  # cuTile is the base
    # within each process 1.30, 1.20, 1.30: the median pairs each triton step with its own process's cuTile step
    assert triton[:4] == ["", "", "", ""] and triton[4] == "triton"
    assert triton[7] == "252.0 [247.0–260.0]" and triton[10] == "1.30x [1.20x–1.30x]"
    assert triton[11] == "190: 5.000 190: 5.000 190: nan"


def test_section_has_one_table_for_every_series_with_each_gpus_environment():
    seed = [{**run, "records": [{**run["records"][0], "label": "cutile_reference"}]} for run in runs()]
    text = long_section({"l": runs(), "l_seed": seed})
    assert text.startswith("## Long context (configs/long.yaml through train.py: bench/curves.py)")
    assert "`python -m bench.curves --config configs/long.yaml --steps 200 --run cutile=" in text
    assert text.count("\n- NVIDIA H200") == 1 and "the process's tensors alone peaked at 10.0 [10.0–12.0] GiB" in text
    assert text.count("| run | processes | exit codes | steady step (ms) |") == 1
    (row,) = [line for line in text.splitlines() if "cutile_reference" in line]
    assert row.startswith("| l_seed | H200 |") and "| 200.0 [190.0–210.0] |" in row  # no cutile run: no ratio


def test_files_named_by_the_arguments_do_not_part_a_series(tmp_path):
    """--data.cache_dir names where the data is kept: processes that differ only there pool; other arguments part."""
    for i, cache in enumerate(["/tmp/a", "/tmp/b", None], 1):
        run = process(200.0, 250.0)
        run["settings"] = {
            **SETTINGS,
            "train_args": [*SETTINGS["train_args"], *([f"--data.cache_dir={cache}"] * bool(cache))],
        }
        write(tmp_path / ("l.json" if i == 1 else f"l_run{i}.json"), run)
    pooled = load_series(tmp_path, "l", "curves")
    assert len(pooled) == 3 and long_rows("l", pooled)[0][2] == "--data.seq_len=16384"
    write(tmp_path / "l_run3.json", {**process(200.0, 250.0), "settings": {**SETTINGS, "train_args": []}})
    with pytest.raises(SystemExit, match=r"differs from .* in train_args"):
        load_series(tmp_path, "l", "curves")


def test_report_renders_each_series_present(tmp_path):
    text, _ = report_beside_minimal_series(tmp_path, "--long", "l,m")
    assert "## Long context" not in text
    for i, run in enumerate(runs(), 1):
        write(tmp_path / ("l.json" if i == 1 else f"l_run{i}.json"), {k: v for k, v in run.items() if k != "file"})
    text, _ = report_beside_minimal_series(tmp_path, "--long", "l,m")
    assert text.count("## Long context") == 1 and "| l | H200 | --data.seq_len=16384 | 200 | cutile | 3 |" in text
