"""Loading a series: the runs of one benchmark must match, and a missing one is named."""

from __future__ import annotations

from tests.bench.report.synthetic import WALLS, kernel_run, run_report, step_run, write


def test_report_refuses_to_pool_runs_measured_differently(tmp_path):
    write(tmp_path / "kernels_h200_run1.json", kernel_run(WALLS))
    write(tmp_path / "kernels_h200_run2.json", kernel_run(WALLS, {"tuning_cache": "z", "repeats": 3, "autotune": 1}))
    write(tmp_path / "step_h200.json", step_run())
    done = run_report(tmp_path, tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"bench.report: {tmp_path / 'kernels_h200_run2.json'} differs from {tmp_path / 'kernels_h200_run1.json'} in repeats"
    ]


def test_report_names_the_missing_results(tmp_path):
    done = run_report(tmp_path, tmp_path)
    assert done.returncode != 0 and "kernels_h200" in done.stderr and "run the benchmark" in done.stderr
