"""The training step: one row per compile mode and layers, step series kept apart, compiled steps' SSD time by
subtraction."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.bench.report.synthetic import CONFIG, WALLS, compiled_step_run, kernel_run, run_report, write


def test_report_renders_step_series_per_compile_mode_and_compiled_amdahl_by_subtraction(tmp_path):
    kernels = kernel_run(WALLS)
    for rec in kernels["records"]:  # the cuTile backward's GPU time = its wall time: GPU ratio half the wall one
        rec["gpu_ms"] *= 2 if rec.get("backward") == "cutile" else 1
    write(tmp_path / "kernels_t.json", kernels)
    triton_ms = (120.0, 100.0, 110.0)
    for i, t in enumerate(triton_ms, 1):
        run = compiled_step_run(t, None)
        run["records"][1]["own_peak_gib"] = 7.5 + i  # triton's: 8.5, 9.5, 10.5 GiB
        write(tmp_path / f"step_c_run{i}.json", run)
    write(tmp_path / "step_g.json", compiled_step_run(70.0, "reduce-overhead"))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- headline:start -->\n<!-- headline:end -->\n")

    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_c,step_g")
    assert done.returncode == 0, done.stderr
    text, head = (tmp_path / "BENCHMARKS.md").read_text(), readme.read_text()

    # One row per compile mode; each series captioned with its own runs.
    step_table = text.split("## The training step")[1].split("## Isolated speedup")[0]
    assert "| compile | triton |" in step_table and "| compile reduce-overhead | triton |" in step_table
    triton_row = next(line for line in step_table.splitlines() if "| compile | triton |" in line)
    assert "| 9.500 [8.500–10.5] |" in triton_row  # own peak GiB, pooled over the three runs
    assert "3 runs: step_c_run1.json, step_c_run2.json, step_c_run3.json." in step_table
    assert "1 run, a single process (a headline needs 3): step_g.json." in step_table
    # The headline shows the series measured three times and names the other.
    ratios = [t / 80.0 for t in triton_ms]
    pooled = f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}x–{max(ratios):.2f}x]"
    assert "| training step, mini (7M parameters), L 1024, batch 2, compile | " in head and pooled in head
    assert "reduce-overhead |" not in head and "the training step (compile reduce-overhead), step_g.json" in head
    header = next(line for line in head.splitlines() if "speedup over triton" in line)
    assert "standin" not in header and "cutile + cutile backward" in header  # the stand-in is not a backend

    # Amdahl of compiled steps: the SSD's time is the step minus the stand-in's.
    rows = json.loads((tmp_path / "reconciliation.json").read_text())
    assert {(r["mode"], r["backend"]) for r in rows} == {
        ("compile", "cutile + cutile backward"),
        ("compile reduce-overhead", "cutile + cutile backward"),
    }
    (row,) = [r for r in rows if r["mode"] == "compile"]
    k_in = [(t - 60.0) / (80.0 - 60.0) for t in triton_ms]
    assert row["k_in_step"]["median"] == pytest.approx(statistics.median(k_in))
    assert row["ssd_by_subtraction"]["median"] == 1.0 and row["forward_only_prediction"] is None
    assert row["predicted_from_in_step"] is None  # it would equal the measured speedup by construction
    assert "| stand-in |" in text.split("## Isolated speedup")[1]
    # k isolated: the wall-clock ratio for steps that launch from the host, the GPU-time ratio under CUDA graphs
    (graphs,) = [r for r in rows if r["mode"] == "compile reduce-overhead"]
    wall = 1.0 / 0.25  # triton over cutile + cutile backward at L 1024 (both scale alike with L)
    assert row["k_isolated_fwd_bwd"]["median"] == pytest.approx(wall)
    assert graphs["k_isolated_fwd_bwd"]["median"] == pytest.approx(wall / 2)


def test_report_keeps_step_series_apart_and_shows_only_rows_every_run_measured(tmp_path):
    """A step row held by two series (other settings) comes from the first listed, never pooled, and the report
    says what it left out; rows of the cuTile conv and norm are their own; a row whose backend failed in some of
    three runs is named, not shown in the headline."""
    write(tmp_path / "kernels_t.json", kernel_run(WALLS))
    write(tmp_path / "step_a.json", compiled_step_run(100.0, None))
    layers = {**CONFIG, "conv_backend": "cutile", "norm_backend": "cutile"}
    b = {**compiled_step_run(110.0, None), "settings": {"out": "b", "steps": 20}}
    b["records"] += [
        {**r, "config": layers, "median": {**r["median"], "step_ms": r["median"]["step_ms"] / 2}} for r in b["records"]
    ]
    write(tmp_path / "step_b.json", b)
    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_a,step_b")
    assert done.returncode == 0, done.stderr
    step_table = (tmp_path / "BENCHMARKS.md").read_text().split("## The training step")[1].split("## Isolated")[0]
    assert (
        "step_b's rows at mini, L 1024, batch 2, compile are left out: step_a, listed first, holds them." in step_table
    )
    rows = {tuple(line.split(" | ")[3:5]): line for line in step_table.splitlines() if line.startswith("| mini")}
    assert "| 100.0 |" in rows["compile", "triton"] and "| 55.0 |" in rows["compile, cuTile conv + norm", "triton"]
    assert "| 1.375 |" in rows["compile, cuTile conv + norm", "cutile + cutile backward"]  # 55 / 40, same layers

    for i in (1, 2, 3):
        run = compiled_step_run(100.0 + i, None)
        if i > 1:  # the cuTile row failed in runs 2 and 3
            run["records"][2] = {"size": "mini", "seqlen": 1024, "mode": "compile", "error": "RuntimeError: boom"}
        write(tmp_path / f"step_e_run{i}.json", run)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- headline:start -->\n<!-- headline:end -->\n")
    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_e")
    assert done.returncode == 0, done.stderr
    head = readme.read_text()
    assert "| training step," not in head
    assert (
        "the training step, mini (7M parameters), L 1024, batch 2, compile: every backend over triton in only 1" in head
    )
    assert "Not measured: mini L 1024 compile: RuntimeError: boom." in (tmp_path / "BENCHMARKS.md").read_text()
