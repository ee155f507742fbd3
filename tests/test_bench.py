"""The measuring instruments' plumbing on the CPU: tiny shapes on the torch backend write valid JSON."""

from __future__ import annotations

import json

import pytest

from scripts import bench_kernels, bench_step

pytestmark = pytest.mark.slow


def test_bench_kernels_writes_json(tmp_path):
    out = tmp_path / "k.json"
    assert (
        bench_kernels.main(
            ["--shapes", "tiny", "--backends", "torch,cutile", "--repeats", "2", "--calls", "2", "--out", str(out)]
        )
        == 0
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
    assert (
        bench_step.main(
            [
                "--sizes",
                "tiny",
                "--seqlens",
                "64",
                "--backends",
                "torch",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (rec,) = json.loads(out.read_text())["records"]
    m = rec["median"]
    assert m["step_ms"] >= m["forward_ms"] > 0 and m["ssd_forward_ms"] > 0 and m["ssd_backward_ms"] > 0
    assert 0 < rec["ssd_share"] < 1 and rec["tokens_per_s"] > 0
