"""scripts/report.py run as a user runs it, on small synthetic benchmark JSON: runs pooled into median [min–max],
every backend, mode and row the JSON holds rendered, captions read from the JSON, Amdahl figures recomputed."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
    cmd = [sys.executable, "scripts/report.py", "--results", str(results), "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def kernel_run(walls: dict[str, float], settings: dict | None = None) -> dict:
    """One bench_kernels process: a fwd and a fwd_bwd record per backend at two sequence lengths."""
    records = []
    for seqlen in (256, 1024):
        for mode in ("fwd", "fwd_bwd"):
            for backend, backward in KERNEL_BACKENDS:
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
    step_table = text.split("## The training step")[1].split("## Isolated speedup")[0]
    cutile = labels[0]
    for backend, mode in ((cutile, "eager"), ("stand-in", "eager"), (cutile, "compile"), ("triton", "compile")):
        assert f"| {mode} | {backend} |" in step_table
    assert "| stand-in | 60.0 | 18.0 | 36.0 | 6.000 | – | – |" in step_table
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
