"""BENCHMARKS.md's first-step section renders bench/first_step.py's JSON, failed runs included."""

from __future__ import annotations

from pathlib import Path

from bench.report.first_step import first_step_section

ENV = {
    "gpu": "NVIDIA H200",
    "driver": "580",
    "torch": "2.11",
    "triton": "3.6.0",
    "cuda_tile": "1.7.0",
    "mamba_ssm": "2.3.2.post1",
    "lightning": "2.6.6",
    "date": "2026-12-04T18:00:00+00:00",
}


def test_each_variant_is_a_row_and_a_failed_run_says_how_it_ended():
    ok = {
        "variant": "cutile:cutile",
        "first": {"exit_code": 0, "process_s": 65.31, "first_step_s": 56.57},
        "steady": {"exit_code": 0, "time/step_ms": 48.226, "throughput/tokens_per_s": 340_000.0},
    }
    failed = {"variant": "triton:reference", "first": {"exit_code": None, "process_s": 150.0}, "steady": {}}
    data = {"environment": ENV, "settings": {"config": "configs/medium.yaml", "steps": 100}, "records": [ok, failed]}
    text = first_step_section(data, Path("results/first_step_h200.json"))
    assert "first_step_h200.json" in text and "--steps 100" in text and "NVIDIA H200" in text
    assert "| cutile:cutile | 65.3 | 56.6 | 48.23 | 340k |" in text
    assert "| triton:reference | exit None | — | — | — |" in text
