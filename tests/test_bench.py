"""The measuring instruments' plumbing on the CPU: the benchmark scripts, run as a user runs them, on tiny
shapes and the torch backend, write valid JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, f"scripts/{script}", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_bench_kernels_writes_json(tmp_path):
    out = tmp_path / "k.json"
    _run(
        "bench_kernels.py",
        *("--shapes", "tiny", "--backends", "torch,cutile", "--repeats", "2", "--calls", "2", "--out", str(out)),
    )
    data = json.loads(out.read_text())
    assert data["kind"] == "bench_kernels" and data["environment"]["torch"]
    assert "cutile" in data["settings"]["skipped"]
    modes = {r["mode"] for r in data["records"]}
    assert modes == {"fwd", "fwd_bwd"}
    for r in data["records"]:
        assert r["backend"] == "torch" and r["wall_ms"]["median"] > 0 and r["wall_ms"]["n"] == 2


def test_bench_step_writes_json(tmp_path):
    out = tmp_path / "s.json"
    _run(
        "bench_step.py",
        *("--configs", "tiny", "--seqlens", "64", "--tokens_per_step", "128", "--backends", "torch"),
        *("--steps", "2", "--warmup", "1", "--out", str(out)),
    )
    data = json.loads(out.read_text())
    (rec,) = data["records"]
    m = rec["median"]
    assert rec["size"] == "tiny" and rec["batch"] == 2 and rec["config"]["d_model"] == 128  # configs/tiny.yaml
    assert m["step_ms"] >= m["forward_ms"] > 0 and m["ssd_forward_ms"] > 0 and m["ssd_backward_ms"] > 0
    assert m["step_ms"] == pytest.approx(m["forward_ms"] + m["backward_ms"] + m["optimizer_ms"])
    assert 0 < rec["ssd_share"] < 1 and rec["tokens_per_s"] > 0
