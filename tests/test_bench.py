"""The measuring instruments' plumbing on the CPU: tiny shapes on the torch backend write valid JSON,
and the report renders tables, plots and README's headline from JSON."""

from __future__ import annotations

import json

import pytest

from scripts import bench_kernels, bench_step, report

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


def _fake_results(tmp_path):
    def krec(backend, mode, seqlen, wall, gpu):
        shape = {
            "batch": 4,
            "seqlen": seqlen,
            "nheads": 8,
            "headdim": 64,
            "dstate": 128,
            "ngroups": 1,
            "chunk_size": 128,
            "dtype": "bfloat16",
        }
        return {
            "shape": shape,
            "mode": mode,
            "backend": backend,
            "wall_ms": {"median": wall},
            "gpu_ms": gpu,
            "GBps_gpu": 1000.0,
            "top_kernels_ms": {f"{backend}_kernel": gpu},
        }

    env = {"gpu": "TestGPU", "torch": "x"}
    kern = {
        "environment": env,
        "ceilings": {"copy_GBps": 4000.0, "bf16_matmul_TFLOPs": 700.0},
        "records": [
            krec("cutile", "fwd", 16384, 0.5, 0.4),
            krec("triton", "fwd", 16384, 1.0, 0.6),
            krec("cutile", "fwd_bwd", 16384, 12.0, 11.0),
            krec("triton", "fwd_bwd", 16384, 4.0, 2.0),
        ],
    }

    def srec(backend, step, ssd_f, ssd_b):
        median = {
            "step_ms": step,
            "forward_ms": step * 0.3,
            "backward_ms": step * 0.65,
            "optimizer_ms": step * 0.05,
            "ssd_forward_ms": ssd_f,
            "ssd_backward_ms": ssd_b,
            "peak_gib": 1.0,
        }
        return {
            "size": "20M",
            "parameters": 18_000_000,
            "config": {"d_state": 128},
            "seqlen": 16384,
            "batch": 1,
            "backend": backend,
            "mode": "eager",
            "median": median,
            "tokens_per_s": 1e5,
            "mfu": 0.02,
            "warmup_s": 1.0,
        }

    step = {
        "environment": env,
        "settings": {"warmup": 2, "steps": 5},
        "records": [srec("cutile", 150.0, 5.0, 80.0), srec("triton", 100.0, 10.0, 30.0)],
    }
    kp, sp = tmp_path / "k.json", tmp_path / "s.json"
    kp.write_text(json.dumps(kern))
    sp.write_text(json.dumps(step))
    return kp, sp


def test_report_renders(tmp_path):
    kp, sp = _fake_results(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.HEADLINE_START}\nstale\n{report.HEADLINE_END}\nrest\n")
    assert (
        report.main(
            [
                "--kernels",
                str(kp),
                "--step",
                str(sp),
                "--out",
                str(tmp_path / "B.md"),
                "--plots",
                str(tmp_path / "plots"),
                "--readme",
                str(readme),
                "--notes",
                "/nonexistent",
            ]
        )
        == 0
    )
    text = (tmp_path / "B.md").read_text()
    assert "| fwd | 16384 | 128 |" in text and "2.000" in text  # triton 1.0 ms / cutile 0.5 ms wall
    assert {p.name for p in (tmp_path / "plots").glob("*.png")} == {
        "kernel_speedup.png",
        "step_breakdown.png",
        "amdahl.png",
    }
    (rec,) = json.loads((tmp_path / "plots" / "reconciliation.json").read_text())
    assert rec["measured"] == pytest.approx(100 / 150)
    assert rec["predicted_from_in_step"] == pytest.approx(report.amdahl(0.4, 40 / 85))
    new = readme.read_text()
    assert "stale" not in new and "0.67x" in new and new.startswith("intro") and new.endswith("rest\n")


def test_amdahl():
    assert report.amdahl(0.0, 5.0) == 1.0
    assert report.amdahl(1.0, 2.0) == pytest.approx(2.0)
    assert report.amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
