"""The SSD alone over the shape sweep: its table, led by each backend's lowest ratio."""

from __future__ import annotations

import statistics

from tests.bench.report.synthetic import WALLS, kernel_run, run_report, step_run, write


def test_report_renders_the_shape_sweep_led_by_its_lowest_ratio(tmp_path):
    write(tmp_path / "kernels_t.json", kernel_run(WALLS))
    sweeps = [{"cutilereference": c, "triton": 1.0, "cutilecutile": 0.25} for c in (0.8, 0.5, 0.7)]
    for i, w in enumerate(sweeps, 1):
        run = kernel_run(w)
        # the sweep's second length is slower for cutile: its lowest ratio is there, whatever the run
        for rec in run["records"]:
            if (rec["shape"]["seqlen"], rec["mode"], rec.get("backward")) == (1024, "fwd", "reference"):
                rec["gpu_ms"] *= 1.25
        write(tmp_path / ("kernels_sw.json" if i == 1 else f"kernels_sw_run{i}.json"), run)
    write(tmp_path / "step_t.json", step_run())

    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_t", "--sweep", "kernels_sw")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "BENCHMARKS.md").read_text()
    section = text.split("## The SSD over the shape sweep")[1].split("## The training step")[0]
    ratios = [1.0 / (1.25 * c) for c in (0.8, 0.5, 0.7)]  # triton's GPU time over cutile's at L 1024
    want = f"cutile {statistics.median(ratios):.2f}x [{min(ratios):.2f}x–{max(ratios):.2f}x] at L 1024 (fwd)"
    assert f"Lowest GPU-time ratio over triton across the sweep: {want};" in section
    assert "3 runs: kernels_sw.json, kernels_sw_run2.json, kernels_sw_run3.json." in section
    assert "--sweep kernels_sw" in text.splitlines()[2]

    # without --sweep there is no such section
    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_t")
    assert done.returncode == 0 and "shape sweep" not in (tmp_path / "BENCHMARKS.md").read_text()
