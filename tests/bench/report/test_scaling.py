"""Scaling to several GPUs: every rank's figure, the headline's efficiency from three runs, a missing series."""

from __future__ import annotations

from tests.bench.report.synthetic import GPU, WALLS, kernel_run, ms, run_report, scaling_run, step_run, write


def test_report_renders_the_scaling_series_with_every_rank(tmp_path):
    write(tmp_path / "kernels_h200.json", kernel_run(WALLS))
    write(tmp_path / "step_h200.json", step_run())
    run = scaling_run()
    write(tmp_path / "scaling_h200x2.json", run)  # the default series: found without --scaling
    readme = tmp_path / "README.md"
    readme.write_text("<!-- headline:start -->\n<!-- headline:end -->\n")

    done = run_report(tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "BENCHMARKS.md").read_text()
    section = text.split("## Scaling to 2 GPUs (bench/bench_scaling.py)")[1]
    assert "1 run, a single process (a headline needs 3): scaling_h200x2.json." in section
    assert f"gpu {GPU}" in section and "variants cutile,triton,torch" in section and "NCCL_NVLS_ENABLE 0" in section
    assert "### eager: mini (7M parameters), L 1024, batch 2 per GPU, 2 GPUs" in section
    assert "AccumulateGrad stream warnings: triton eager: 3." in section
    assert "Not measured: torch eager: rank 1: RuntimeError: out of memory." in section

    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in section.splitlines() if line.startswith("| ")}
    for name, rec in zip(("cutile", "triton"), run["records"]):
        p = rec["phases"]
        single, ddp, unsynced = (p[k]["step_ms"] for k in ("single", "ddp", "no_sync"))
        each = [" / ".join(f"{r['step_ms']:.1f}" for r in p[k]["per_rank"]) for k in ("single", "ddp", "no_sync")]
        assert rows[name][:3] == [f"{single:.1f} ({each[0]})", f"{ddp:.1f} ({each[1]})", f"{unsynced:.1f} ({each[2]})"]
        tokens_1, tokens_2 = 2048 / (single / 1e3), 2 * 2048 / (ddp / 1e3)
        assert rows[name][3:8] == [f"{tokens_1:,.0f}", f"{tokens_2:,.0f}", f"{2 * single / ddp:.2f}x"] + [
            f"{100 * single / ddp:.1f}%",
            "28",
        ]
        exposed = ddp - unsynced  # the all-reduce takes 4 ms: overlap 1 - exposed / 4, below 0 for triton
        assert rows[name][9:12] == ["7", ms(exposed), f"{100 * (1 - exposed / 4):.0f}%"]
        assert rows[name][12] == " / ".join(ms(r["ssd_forward_ms"]) for r in p["single"]["per_rank"])
    # The slowest rank sets the DDP step: triton's ranks 113 and 141 ms give 141 ms, 93 / 141 efficiency.
    assert rows["triton"][1] == "141.0 (113.0 / 141.0)" and rows["triton"][6] == f"{100 * 93 / 141:.1f}%"
    assert "torch" not in rows

    assert "![scaling](scaling.png)" in text and (tmp_path / "scaling.png").stat().st_size > 0
    head = readme.read_text()
    assert "Not in the headline, measured in 1 run (3 needed): scaling to 2 GPUs, scaling_h200x2.json" in head
    assert "scaling efficiency" not in head


def test_report_headline_shows_scaling_from_three_runs(tmp_path):
    write(tmp_path / "kernels_t.json", kernel_run(WALLS))
    write(tmp_path / "step_t.json", step_run())
    scales = (1.0, 1.2, 1.1)  # cutile's DDP and no_sync steps per run; the rest alike in every run
    for i, scale in enumerate(scales, 1):
        write(tmp_path / f"scale_t_run{i}.json", scaling_run(scale))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- headline:start -->\n<!-- headline:end -->\n")

    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_t", "--scaling", "scale_t")
    assert done.returncode == 0, done.stderr
    head = readme.read_text()
    assert f"| {GPU}, 2 GPUs: scaling efficiency | cutile | triton | runs |" in head
    cutile = sorted(101 / (105 * s) for s in scales)  # the 1-GPU step (median of 100 and 102) over the slowest DDP
    triton = 93 / 141  # the same in every run
    cells = [f"{100 * cutile[1]:.1f}% [{100 * cutile[0]:.1f}%–{100 * cutile[2]:.1f}%]"]
    cells += [f"{100 * triton:.1f}% [{100 * triton:.1f}%–{100 * triton:.1f}%]"]
    assert f"| mini, L 1024, batch 2 per GPU, eager | {cells[0]} | {cells[1]} | 3 runs |" in head
    text = (tmp_path / "BENCHMARKS.md").read_text()
    ddp = sorted(105 * s for s in scales)
    rank1 = sorted(104 * s for s in scales)
    assert "| cutile | 101.0 [101.0–101.0] (100.0 [100.0–100.0] / 102.0 [102.0–102.0]) | " in text
    assert f"| {ddp[1]:.1f} [{ddp[0]:.1f}–{ddp[2]:.1f}] (" in text and f" / {rank1[1]:.1f} [{rank1[0]:.1f}–" in text
    assert "3 runs: scale_t_run1.json, scale_t_run2.json, scale_t_run3.json." in text


def test_report_names_a_missing_scaling_series(tmp_path):
    write(tmp_path / "kernels_h200.json", kernel_run(WALLS))
    write(tmp_path / "step_h200.json", step_run())
    assert run_report(tmp_path, tmp_path).returncode == 0  # no scaling_h200x2*.json: no section, no error
    assert "## Scaling" not in (tmp_path / "BENCHMARKS.md").read_text() and not (tmp_path / "scaling.png").exists()
    done = run_report(tmp_path, tmp_path, "--scaling", "scaling_none")
    assert done.returncode != 0 and "scaling_none" in done.stderr and "run the benchmark" in done.stderr
