"""Synthetic benchmark JSON for the report's tests, and the report run as a user runs it, `python -m bench.report`
on files written to a temporary directory: in this process (one import of the report and torch for every test)."""

from __future__ import annotations

import io
import json
import statistics
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

GPU = "TestGPU-7"
SHAPE = {"batch": 3, "nheads": 5, "headdim": 64, "dstate": 128, "ngroups": 1, "chunk_size": 128, "dtype": "bfloat16"}
CONFIG = {"d_model": 96, "n_layer": 2, "d_state": 128, "headdim": 64, "ngroups": 1, "chunk_size": 128}
KERNEL_BACKENDS = [  # (backend, backward): the order the JSON holds, which the report must keep
    ("cutile", "reference"),
    ("triton", None),
    ("cutile", "cutile"),
]
WALLS = {"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.25}  # wall ms per backend + backward at L 256


def run_report(results: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """`python -m bench.report --results RESULTS --out OUT EXTRA...`: its exit status, stdout and stderr as the
    process would give them (a SystemExit with a message: that line on stderr and status 1)."""
    from bench.report.cli import main

    argv = ["--results", str(results), "--out", str(out), *extra]
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as e:  # as the interpreter ends with it: a message goes to stderr with status 1
            code = e.code
            if isinstance(code, str):
                print(code, file=sys.stderr)
                code = 1
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "bench.report", *argv], code or 0, stdout.getvalue(), stderr.getvalue()
    )


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


def pooled(values: list[float], fmt: str = "{:.3f}") -> str:
    """median [min–max] of three values, as the report writes them."""
    lo, mid, hi = (fmt.format(v) for v in sorted(values))
    return f"{mid} [{lo}–{hi}]"


def write(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload))


def report_beside_minimal_series(results: Path, *extra: str) -> tuple[str, str]:
    """`python -m bench.report` in `results` over a minimal kernels and step series (kernels_t, step_t, written
    here) and the options EXTRA: BENCHMARKS.md's text and the report's stdout; the test fails if the report does."""
    write(results / "kernels_t.json", kernel_run(WALLS))
    write(results / "step_t.json", step_run())
    done = run_report(results, results, "--kernels", "kernels_t", "--step", "step_t", *extra)
    assert done.returncode == 0, done.stderr
    return (results / "BENCHMARKS.md").read_text(), done.stdout
