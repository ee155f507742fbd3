"""BENCHMARKS.md's long-context section pools bench/curves.py's processes of configs/long.yaml: median [min–max]
of each run's step, tokens/s and memory, triton's step over cuTile's taken within each process, every process's
last loss (a loss that is not finite shows as nan), and nothing when the series is absent."""

from __future__ import annotations

from pathlib import Path

from bench.report.long_context import long_rows, long_section
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
    cutile, triton = long_rows(runs())
    assert cutile[:7] == ["cutile", "3", "0 0 0", "200.0 [190.0–210.0]", "328k [312k–345k]", "20.0 [20.0–20.0]",
                         "10.0 [10.0–10.0]"]  # fmt: skip
    assert cutile[7] == ""  # cuTile is the base
    # within each process 1.30, 1.20, 1.30: the median pairs each triton step with its own process's cuTile step
    assert triton[3] == "252.0 [247.0–260.0]" and triton[7] == "1.30x [1.20x–1.30x]"
    assert triton[8] == "190: 5.000 190: 5.000 190: nan"


def test_section_names_the_command_processes_and_environment():
    text = long_section(runs())
    assert text.startswith("## Long context (configs/long.yaml, --data.seq_len=16384)")
    assert "python -m bench.curves --config configs/long.yaml --steps 200 --run cutile=" in text
    assert "3 runs (l_run1.json, l_run2.json, l_run3.json)" in text and "NVIDIA H200" in text
    assert "| run | processes | exit codes | steady step (ms) |" in text


def test_report_renders_each_series_present(tmp_path):
    text, _ = report_beside_minimal_series(tmp_path, "--long", "l,m")
    assert "## Long context" not in text
    for i, run in enumerate(runs(), 1):
        write(tmp_path / ("l.json" if i == 1 else f"l_run{i}.json"), {k: v for k, v in run.items() if k != "file"})
    text, _ = report_beside_minimal_series(tmp_path, "--long", "l,m")
    assert text.count("## Long context") == 1 and "3 runs (l.json, l_run2.json, l_run3.json)" in text


def test_a_series_without_cutile_points_to_the_one_with_it():
    seed = [{**run, "records": [{**run["records"][0], "label": "cutile_reference"}]} for run in runs()]
    (row,) = long_rows(seed)
    assert row[0] == "cutile_reference" and row[3] == "200.0 [190.0–210.0]" and row[7] == ""
    assert "no cutile run: compare with the series without _seed" in long_section(seed)
    assert "_seed" not in long_section(runs())
