"""bench/report.py run as a user runs it, on small synthetic benchmark JSON: runs pooled into median [min–max],
every backend, mode and row the JSON holds rendered, captions read from the JSON, Amdahl figures recomputed."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

GPU = "TestGPU-7"
SHAPE = {"batch": 3, "nheads": 5, "headdim": 64, "dstate": 128, "ngroups": 1, "chunk_size": 128, "dtype": "bfloat16"}
CONFIG = {"d_model": 96, "n_layer": 2, "d_state": 128, "headdim": 64, "ngroups": 1, "chunk_size": 128}
KERNEL_BACKENDS = [  # (backend, backward): the order the JSON holds, which the report must keep
    ("cutile", "reference"),
    ("triton", None),
    ("cutile", "cutile"),
]


def run_report(results: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bench.report", "--results", str(results), "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def kernel_run(walls: dict[str, float], settings: dict | None = None) -> dict:
    """One bench_kernels process at two sequence lengths: a fwd_bwd record per backend and backward, and, as
    bench_kernels writes them, one fwd record per backend (cutile's, labelled with the reference backward)."""
    records = []
    for seqlen in (256, 1024):
        for mode in ("fwd", "fwd_bwd"):
            for backend, backward in KERNEL_BACKENDS:
                if mode == "fwd" and backward not in (None, "reference"):
                    continue
                wall = walls[backend + (backward or "")] * seqlen / 256 * (3 if mode == "fwd_bwd" else 1)
                rec = {"shape": {**SHAPE, "seqlen": seqlen}, "mode": mode, "backend": backend}
                rec |= {"wall_ms": {"median": wall}, "gpu_ms": wall / 2, "GBps_gpu": 100.0, "kernels_per_call": 3}
                records.append(rec | ({"backward": backward} if backward else {}))
    env = {"gpu": GPU, "torch": "t", "date": f"d{walls['triton']}"}
    return {
        "kind": "bench_kernels",
        "environment": env,
        "ceilings": {"copy_GBps": 1000.0},
        "settings": settings or {"out": "x", "repeats": 2, "autotune": True},
        "records": records,
    }


def step_record(backend: str, mode: str, step_ms: float, ssd_fwd: float, ssd_bwd: float, **extra) -> dict:
    median = {"step_ms": step_ms, "forward_ms": step_ms * 0.3, "backward_ms": step_ms * 0.6}
    median |= {"optimizer_ms": step_ms * 0.1, "ssd_forward_ms": ssd_fwd, "ssd_backward_ms": ssd_bwd}
    rec = {"size": "mini", "parameters": 7_000_000, "config": CONFIG, "seqlen": 1024, "batch": 2}
    return rec | {"backend": backend, "mode": mode, "median": median, "tokens_per_s": 2048 / step_ms * 1e3} | extra


def step_run() -> dict:
    """One bench_step process: eager and compiled steps, and a row with no SSD at all."""
    records = [
        step_record("cutile", "eager", 150.0, 5.0, 80.0, backward="reference"),
        step_record("triton", "eager", 100.0, 10.0, 30.0),
        step_record("stand-in", "eager", 60.0, 0.0, 0.0),
        step_record("cutile", "compile", 120.0, 0.0, 0.0, backward="reference"),
        step_record("triton", "compile", 90.0, 0.0, 0.0),
    ]
    settings = {"out": "s", "tokens_per_step": 2048, "modes": "eager,compile"}
    return {"kind": "bench_step", "environment": {"gpu": GPU}, "settings": settings, "records": records}


def scaling_record(
    backend: str, backward: str | None, ms: dict[str, list[float]], ssd_fwd: list[float], **extra
) -> dict:
    """One bench_scaling record on len(ssd_fwd) GPUs: per phase, each rank's median step; figures derived as
    bench_scaling derives them (1 GPU: the median of the ranks; DDP and no_sync: the slowest rank)."""
    world, tokens, allreduce_ms = len(ssd_fwd), 2 * 1024, 4.0
    phases = {}
    for phase, steps in ms.items():
        per_rank = [
            {"step_ms": t, "forward_ms": t / 3, "backward_ms": t / 2, "ssd_forward_ms": f, "ssd_backward_ms": 3 * f}
            for t, f in zip(steps, ssd_fwd)
        ]
        step_ms = statistics.median(steps) if phase == "single" else max(steps)
        gpus = 1 if phase == "single" else world
        phases[phase] = {"median": per_rank[0], "per_rank": per_rank, "step_ms": step_ms}
        phases[phase]["tokens_per_s"] = gpus * tokens / (step_ms / 1e3)
    single, ddp, unsynced = (phases[p]["step_ms"] for p in ("single", "ddp", "no_sync"))
    rec = {"size": "mini", "parameters": 7_000_000, "config": CONFIG, "seqlen": 1024, "batch_per_gpu": 2}
    rec |= {"world_size": world, "variant": backend, "backend": backend, "backward": backward, "mode": "eager"}
    rec |= {"warmup_s": {"ddp": 9.5, "no_sync": 0.5, "single": 0.5}, "stream_warnings": 0, "phases": phases}
    rec["allreduce"] = {"bytes": 28_000_000, "ms": allreduce_ms, "busbw_GBps": 7.0, "ms_per_rank": [4.0] * world}
    rec |= {"scaling_efficiency": single / ddp, "speedup": world * single / ddp, "exposed_comm_ms": ddp - unsynced}
    return rec | {"overlap": 1 - (ddp - unsynced) / allreduce_ms} | extra


def scaling_run(ddp_scale: float = 1.0) -> dict:
    """One bench_scaling process on 2 GPUs: a balanced backend (its DDP and no_sync steps times `ddp_scale`),
    one whose ranks disagree, one that failed."""
    balanced = {"single": [100.0, 102.0], "ddp": [105.0, 104.0], "no_sync": [103.0, 102.0]}
    balanced |= {k: [ddp_scale * t for t in balanced[k]] for k in ("ddp", "no_sync")}
    skewed = {"single": [90.0, 96.0], "ddp": [113.0, 141.0], "no_sync": [91.0, 99.0]}
    records = [
        scaling_record("cutile", "reference", balanced, [5.0, 5.0]),
        scaling_record("triton", None, skewed, [6.0, 15.0], stream_warnings=3),
        {"variant": "torch", "mode": "eager", "error": "rank 1: RuntimeError: out of memory"},
    ]
    settings = {"out": "sc", "config": "mini", "seqlen": 1024, "batch": 2, "world_size": 2, "quick": True}
    settings |= {"variants": ["cutile", "triton", "torch"], "NCCL_NVLS_ENABLE": "0"}
    env = {"gpu": GPU, "gpu_count": 2}
    return {"kind": "bench_scaling", "environment": env, "settings": settings, "records": records}


def ms(v: float) -> str:
    """A time as the report writes it: three decimals below 10, one above."""
    return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"


def write(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload))


def test_report_pools_runs_and_renders_what_the_json_holds(tmp_path):
    walls = [{"cutilereference": 0.5, "triton": t, "cutilecutile": 0.25} for t in (1.2, 1.0, 1.5)]
    for i, w in enumerate(walls, 1):
        write(tmp_path / f"kernels_t_run{i}.json", kernel_run(w))
    write(tmp_path / "step_t.json", step_run())
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- headline:start -->\nstale\n<!-- headline:end -->\nrest\n")

    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_t", "--step", "step_t")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "BENCHMARKS.md").read_text()

    # Runs pooled: the headline's ratio is the median [min–max] of the per-run ratios.
    ratios = [w["triton"] / w["cutilereference"] for w in walls]
    pooled = f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}x–{max(ratios):.2f}x]"
    head = readme.read_text()
    assert pooled in head and pooled in text and "3 runs" in head and "1 run" in head
    assert "stale" not in head and head.startswith("intro\n") and head.endswith("rest\n")
    # A headline figure needs 3 processes: the step benchmark (1 run) is named there, its rows are not shown.
    assert "| training step," not in head and "Not in the headline, measured in 1 run" in head

    # Every backend label, in the JSON's order; every step mode and row; captions from the JSON.
    labels = ["cutile", "triton", "cutile + cutile backward"]  # the reference backward is cutile's own
    kernel_table = text.split("## The SSD alone")[1].split("## The training step")[0]
    first = [kernel_table.index(f"| {name} |") for name in labels]
    assert first == sorted(first)
    # The backward alone: forward + backward less its backend's forward, within each run (GPU time: half the wall;
    # forward + backward, 3x the forward's wall); the cuTile backward's less the one cuTile forward.
    for name, key in (("cutile + cutile backward", "cutilecutile"), ("triton", "triton")):
        fwd_key = "cutilereference" if key == "cutilecutile" else key
        gpu = [(3 * w[key] - w[fwd_key]) / 2 for w in walls]
        want = f"{ms(statistics.median(gpu))} [{ms(min(gpu))}–{ms(max(gpu))}]"
        assert (
            f"| bwd | 256 | {name} | " in kernel_table
            and f"| {want} |" in kernel_table.split(f"| bwd | 256 | {name} |")[1].split("\n")[0]
        )
    step_table = text.split("## The training step")[1].split("## Isolated speedup")[0]
    cutile = labels[0]
    for backend, mode in ((cutile, "eager"), ("stand-in", "eager"), (cutile, "compile"), ("triton", "compile")):
        assert f"| {mode} | {backend} |" in step_table
    rest = next(r for r in step_run()["records"] if r["backend"] == "stand-in")["median"]  # step, fwd, bwd, optimizer
    row = f"| stand-in | {rest['step_ms']:.1f} | {rest['forward_ms']:.1f} | {rest['backward_ms']:.1f} | "
    assert row + f"{rest['optimizer_ms']:.3f} | – | – |" in step_table
    assert f"gpu {GPU}" in text and "batch 3, heads 5" in text and "H200" not in text + head

    # Amdahl, recomputed here from the synthetic step: only rows with the SSD timed for both backends.
    (row,) = json.loads((tmp_path / "reconciliation.json").read_text())
    assert (row["backend"], row["mode"]) == (cutile, "eager")
    share, k_in = (10 + 30) / 100, (10 + 30) / (5 + 80)
    assert row["measured"]["median"] == pytest.approx(100 / 150)
    assert row["predicted_from_in_step"]["median"] == pytest.approx(1 / ((1 - share) + share / k_in))
    k_iso = statistics.median(ratios)  # the fwd_bwd wall ratio at the step's L 1024 scales like the fwd one
    assert row["k_isolated_fwd_bwd"]["median"] == pytest.approx(k_iso)
    assert {p.name for p in tmp_path.glob("*.png")} == {"kernel_speedup.png", "step_breakdown.png", "amdahl.png"}


def test_report_refuses_to_pool_runs_measured_differently(tmp_path):
    w = {"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25}
    write(tmp_path / "kernels_h200_run1.json", kernel_run(w))
    write(tmp_path / "kernels_h200_run2.json", kernel_run(w, {"out": "y", "repeats": 3, "autotune": True}))
    write(tmp_path / "step_h200.json", step_run())
    done = run_report(tmp_path, tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"report.py: {tmp_path / 'kernels_h200_run2.json'} differs from {tmp_path / 'kernels_h200_run1.json'} in repeats"
    ]


def test_report_names_the_missing_results(tmp_path):
    done = run_report(tmp_path, tmp_path)
    assert done.returncode != 0 and "kernels_h200" in done.stderr and "run the benchmark" in done.stderr


def test_report_renders_the_scaling_series_with_every_rank(tmp_path):
    w = {"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25}
    write(tmp_path / "kernels_h200.json", kernel_run(w))
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
    w = {"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25}
    write(tmp_path / "kernels_t.json", kernel_run(w))
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
    w = {"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25}
    write(tmp_path / "kernels_h200.json", kernel_run(w))
    write(tmp_path / "step_h200.json", step_run())
    assert run_report(tmp_path, tmp_path).returncode == 0  # no scaling_h200x2*.json: no section, no error
    assert "## Scaling" not in (tmp_path / "BENCHMARKS.md").read_text() and not (tmp_path / "scaling.png").exists()
    done = run_report(tmp_path, tmp_path, "--scaling", "scaling_none")
    assert done.returncode != 0 and "scaling_none" in done.stderr and "run the benchmark" in done.stderr


def test_headline_script_renders_its_own_series(tmp_path):
    """bench/headline.sh report: the series its kernels, step, step_graphs, step_layers, step_l8192 and sweep
    parts write, three kernel processes pooled; no scaling run, none shown."""
    walls = [{"cutilereference": 0.5, "triton": t, "cutilecutile": 0.25} for t in (1.2, 1.0, 1.5)]
    write(tmp_path / "kernels_h200_headline.json", kernel_run(walls[0]))
    for i, w in enumerate(walls[1:], 2):
        write(tmp_path / f"kernels_h200_headline_run{i}.json", kernel_run(w))
    write(tmp_path / "step_h200_compiled.json", step_run())
    write(tmp_path / "step_h200_cudagraphs.json", compiled_step_run(70.0, "reduce-overhead"))
    layers = compiled_step_run(65.0, "reduce-overhead")
    layers["records"] = [{**r, "config": {**CONFIG, "conv_backend": "cutile"}} for r in layers["records"]]
    write(tmp_path / "step_h200_layers_graphs_quick.json", layers)
    write(tmp_path / "step_h200_l8192_layers_graphs_quick.json", layers)
    write(tmp_path / "kernels_h200_sweep.json", kernel_run(walls[0]))
    (tmp_path / "README.md").write_text("<!-- headline:start -->\n<!-- headline:end -->\n")
    env = {**os.environ, "RESULTS": str(tmp_path), "OUT": str(tmp_path)}
    done = subprocess.run(["bash", "bench/headline.sh", "report"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ratios = sorted(w["triton"] / w["cutilereference"] for w in walls)
    head = (tmp_path / "README.md").read_text()
    assert f"{ratios[1]:.2f}x [{ratios[0]:.2f}x–{ratios[2]:.2f}x]" in head
    series = ("step_h200_compiled", "step_h200_cudagraphs", "step_h200_layers_graphs_quick")
    for name in (*series, "step_h200_l8192_layers_graphs_quick"):  # one run each
        assert f"{name}.json" in head
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## The SSD over the shape sweep" in text and "## Scaling" not in text
    assert "step_h200_compile_quick" not in text  # the series replaces the single run
    bad = subprocess.run(["bash", "bench/headline.sh", "kernels", "4"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "1, 2 or 3" in bad.stderr


def compiled_step_run(triton_ms: float, compile_mode: str | None) -> dict:
    """One bench_step process of compiled steps: no SSD marks, each SSD's time by the stand-in subtraction."""
    rest = 60.0
    records = [
        step_record("standin", "compile", rest, 0.0, 0.0, compile_mode=compile_mode),
        step_record("triton", "compile", triton_ms, 0.0, 0.0, compile_mode=compile_mode),
        step_record("cutile", "compile", 80.0, 0.0, 0.0, backward="cutile", compile_mode=compile_mode),
    ]
    for rec in records[1:]:
        rec["ssd_ms_by_subtraction"] = rec["median"]["step_ms"] - rest
    settings = {"out": "c", "modes": "compile", "compile_mode": compile_mode}
    return {"kind": "bench_step", "environment": {"gpu": GPU}, "settings": settings, "records": records}


def test_report_renders_step_series_per_compile_mode_and_compiled_amdahl_by_subtraction(tmp_path):
    kernels = kernel_run({"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25})
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
    write(tmp_path / "kernels_t.json", kernel_run({"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25}))
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


def test_report_amdahl_takes_the_kernel_shape_of_the_step_and_names_failed_series(tmp_path):
    """With two kernel shapes at the step's L and SSD dimensions, the isolated speedup is the one with the step's
    batch and heads; a step series that failed in every one of its three runs is named in the headline."""
    kernels = kernel_run({"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25})
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


def fwd_pass_state_name(Q: int) -> str:
    """fwd_pass_state's kernel name as the profiler lists it, specialized for chunk size Q (CI's bf16 signature)."""
    from cuda.tile import compilation as ctc

    from bench import aot
    from bench.traffic import kernel_parameters

    sig = next(s for label, _, s in aot.signatures() if label.startswith("fwd_pass_state[bfloat16,Q=128"))
    params = list(sig.parameters)
    params[kernel_parameters("fwd_pass_state").index("Q")] = ctc.ConstantConstraint(Q)
    return ctc.mangle_kernel_name("fwd_pass_state_kernel", ctc.KernelSignature(params, sig.calling_convention))


def pooled(values: list[float], fmt: str = "{:.3f}") -> str:
    """median [min–max] of three values, as the report writes them."""
    lo, mid, hi = (fmt.format(v) for v in sorted(values))
    return f"{mid} [{lo}–{hi}]"


def test_report_renders_gpu_time_per_kernel_and_the_memory_floor(tmp_path):
    """Each kernel's GPU time pooled over runs; fwd_pass_state at the forward's chunk 128 and the backward's 64 kept
    apart, each against its own floor (of all its launches in a call); names shortened; a record without
    per-kernel times left out."""
    q128, q64 = fwd_pass_state_name(128), fwd_pass_state_name(64)
    reduce = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::sum_functor<float> > >(X)"
    shape = {**SHAPE, "seqlen": 256}
    times = {128: [0.30, 0.32, 0.31], 64: [0.20, 0.22, 0.27]}  # ms per run
    copy = [1000.0, 2000.0, 3000.0]  # each run's copy ceiling, GB/s
    for i in range(3):
        top = {q128: times[128][i], q64: times[64][i], reduce: 0.05}
        cutile = {"shape": shape, "mode": "fwd_bwd", "backend": "cutile", "backward": "cutile", "gpu_ms": 1.0}
        cutile |= {"wall_ms": {"median": 2.0}, "kernels_per_call": 9, "top_kernels_ms": top}
        cutile |= {"kernel_launches": {q128: 1, q64: 2, reduce: 1}}  # Q 64 launched twice per call
        triton_top = {"_chunk_scan_fwd_kernel": 0.4} | ({"_chunk_state_bwd_db_kernel": 0.1} if i == 0 else {})
        triton = {"shape": shape, "mode": "fwd_bwd", "backend": "triton", "gpu_ms": 0.5, "wall_ms": {"median": 3.0}}
        triton |= {"kernels_per_call": 3 if i == 0 else 2, "top_kernels_ms": triton_top}
        if i == 0:  # every kind listed, one launched twice: nothing left over
            triton["kernel_launches"] = {"_chunk_scan_fwd_kernel": 2, "_chunk_state_bwd_db_kernel": 1}
        plain = {"shape": shape, "mode": "fwd_bwd", "backend": "cutile", "backward": "reference", "gpu_ms": 4.0}
        plain |= {"wall_ms": {"median": 5.0}}  # no top_kernels_ms
        run = {"kind": "bench_kernels", "environment": {"gpu": GPU}, "ceilings": {"copy_GBps": copy[i]}}
        run |= {"settings": {"out": "k"}, "records": [cutile, triton, plain]}
        write(tmp_path / f"kernels_k_run{i + 1}.json", run)
    write(tmp_path / "step_t.json", step_run())

    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_k", "--step", "step_t")
    assert done.returncode == 0, done.stderr
    section = (tmp_path / "BENCHMARKS.md").read_text().split("### GPU time per kernel")[1].split("## The training")[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line[:2] == "| "]
    rows = {tuple(c[:2]): c[2:] for c in cells}

    # The forward's Q 128 and the backward's Q 64: two rows, each with its own runs and its own floor.
    b, l, h, p, n = 3, 256, 5, 64, 128
    for Q, ms in times.items():
        moved = 2 * b * l * h * p + 2 * b * l * n + 2 * 4 * b * h * l  # x, B in bf16; dt_out, dA_cumsum in float32
        moved += 2 * b * (l // Q) * h * p * n + 4 * b * h * p * n  # chunk_states (bf16) and final_state written
        moved *= {128: 1, 64: 2}[Q]  # the floor of every launch in the call
        floor_us = [moved / (gbps * 1e3) for gbps in copy]
        of_floor = [f / (m * 1e3) for f, m in zip(floor_us, ms)]
        row = rows[("cutile + cutile backward", f"`fwd_pass_state` (Q {Q})")]
        assert row == [
            pooled(ms),
            f"{moved / 1e6:,.1f}",
            pooled(floor_us),
            pooled([100 * f for f in of_floor], "{:.0f}%"),
        ]
    # Other kernels: shortened, no floor; the call's time less the listed kernels' where it launched more.
    assert rows[("cutile + cutile backward", "`reduce_kernel (sum_functor)`")] == ["0.050 [0.050–0.050]", "", "", ""]
    rest = [1.0 - times[128][i] - times[64][i] - 0.05 for i in range(3)]
    assert rows[("cutile + cutile backward", "other kernels")][0] == pooled(rest)
    assert rows[("triton", "`_chunk_state_bwd_db_kernel` (in 1 of 3 runs)")][0] == "0.100"
    # Runs 2 and 3 list one of triton's two launches; run 1 lists all three (one kernel twice): no row there.
    assert rows[("triton", "other kernels (in 2 of 3 runs)")][0] == "0.100 [0.100–0.100]"
    assert ("triton", "other kernels") not in rows
    assert not any(k[0] == "cutile" for k in rows)  # the record without per-kernel times

    # No per-kernel times anywhere: said so, no table.
    walls = {"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.3}
    for i in (1, 2, 3):
        write(tmp_path / f"kernels_k_run{i}.json", kernel_run(walls))
    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_k", "--step", "step_t")
    assert done.returncode == 0, done.stderr
    assert "No per-kernel GPU times in the JSON (`top_kernels_ms`)." in (tmp_path / "BENCHMARKS.md").read_text()


def test_report_renders_runs_made_without_a_gpu(tmp_path):
    """A CPU run records gpu None and no kernel time (null): the report names the device CPU and leaves the
    GPU cells empty instead of failing; a tiny model's size reads in thousands of parameters."""
    run = kernel_run({"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25})
    run["environment"]["gpu"] = None
    for rec in run["records"]:
        rec["gpu_ms"] = rec["GBps_gpu"] = None
    write(tmp_path / "kernels_c.json", run)
    step = step_run()
    step["environment"] = {"gpu": None}
    for rec in step["records"]:
        rec["parameters"] = 481_328  # a model under a million parameters is counted in thousands
    write(tmp_path / "step_c.json", step)
    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_c", "--step", "step_c")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "CPU" in text and "None" not in text
    assert "mini (481K parameters)" in text


def test_report_renders_the_shape_sweep_led_by_its_lowest_ratio(tmp_path):
    write(tmp_path / "kernels_t.json", kernel_run({"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25}))
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
