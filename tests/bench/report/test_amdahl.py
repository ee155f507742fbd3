"""Amdahl's reconciliation: the isolated speedup is taken at the step's own kernel shape."""

from __future__ import annotations

import json

import pytest

from tests.bench.report.synthetic import CONFIG, GPU, SHAPE, WALLS, kernel_run, run_report, step_run, write


def test_report_amdahl_takes_the_kernel_shape_of_the_step_and_names_failed_series(tmp_path):
    """With two kernel shapes at the step's L and SSD dimensions, the isolated speedup is the one with the step's
    batch and heads; a step series that failed in every one of its three runs is named in the headline."""
    kernels = kernel_run(WALLS)
    step_shape = {**SHAPE, "batch": 2, "nheads": 3, "seqlen": 1024}  # expand 2 x d_model 96 / headdim 64 = 3 heads
    for backend, backward, wall in (("cutile", "reference", 2.0), ("triton", None, 3.0)):
        rec = {"shape": step_shape, "mode": "fwd_bwd", "backend": backend, "wall_ms": {"median": wall}}
        kernels["records"].append(rec | {"gpu_ms": wall / 2} | ({"backward": backward} if backward else {}))
    write(tmp_path / "kernels_t.json", kernels)
    step = step_run()
    for rec in step["records"]:
        rec["config"] = {**CONFIG, "expand": 2}
    write(tmp_path / "step_t.json", step)
    failed = {"kind": "bench_step", "environment": {"gpu": GPU}, "settings": {"out": "f"}}
    for i in (1, 2, 3):
        records = [{"size": "mini", "seqlen": 1024, "mode": "compile", "compile_mode": "reduce-overhead", "error": "x"}]
        write(tmp_path / f"step_f_run{i}.json", failed | {"records": records})
    readme = tmp_path / "README.md"
    readme.write_text("<!-- headline:start -->\n<!-- headline:end -->\n")

    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_t,step_f")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((tmp_path / "reconciliation.json").read_text())
    assert row["k_isolated_fwd_bwd"]["median"] == pytest.approx(3.0 / 2.0)  # the (batch 2, 3 heads) shape's
    head = readme.read_text()
    assert "the training step (compile reduce-overhead), step_f_run1.json, step_f_run2.json" in head
    assert "every record is an error." in head
