"""bench/bench_scaling.py on the CPU: two gloo processes and one, a tiny model, the figures' bookkeeping.

The figures themselves are GPU figures (see the script); here: every phase and rank is there, the step split
adds up, and the derived figures follow from the measured ones. One process runs in this one; two are spawned
processes (the slow tier).
"""

from __future__ import annotations

import json

import pytest

from bench import bench_scaling
from tests.helpers import run_script, stored

SEQLEN, BATCH = 64, 2


def _arguments(out, devices: int) -> list[str]:
    """bench_scaling's arguments for a one-step CPU run of `devices` processes writing `out`."""
    return [
        "--config=tiny",
        f"--seqlen={SEQLEN}",
        f"--batch={BATCH}",
        f"--devices={devices}",
        "--device=cpu",
        "--backends=torch,triton",
        "--modes=eager",
        "--warmup=1",
        "--steps=1",  # one timed step: each median is that step, whose split must add up exactly
        f"--out={out}",
    ]


def _check_phase(phase: dict, ranks: int) -> None:
    assert len(phase["per_rank"]) == ranks
    for split in phase["per_rank"]:
        parts = split["forward_ms"] + split["backward_ms"] + split["optimizer_ms"]
        assert split["step_ms"] > 0 and abs(parts - split["step_ms"]) < 1e-6 * split["step_ms"]
        assert 0 < split["ssd_forward_ms"] < split["forward_ms"]  # eager: the SSD's own marks, inside the forward
    assert phase["step_ms_spread"]["n"] == ranks  # every timed step of every rank


@pytest.mark.slow  # two spawned processes, each loading torch: seconds the default tier does not spend
def test_two_processes(tmp_path):
    out = tmp_path / "scaling2.json"
    done = run_script("-m", "bench.bench_scaling", *_arguments(out, 2), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("skipping backend triton") == 1  # said once, by rank 0
    data = json.loads(out.read_text())
    assert data["kind"] == "bench_scaling" and data["environment"]["torch"]
    settings = data["settings"]
    assert settings["world_size"] == 2 and settings["variants"] == ["torch"] and "triton" in settings["skipped"]
    assert settings["NCCL_NVLS_ENABLE"] == "0"
    (rec,) = data["records"]
    assert (rec["variant"], rec["mode"], rec["world_size"]) == ("torch", "eager", 2)
    assert set(rec["phases"]) == {"single", "ddp", "no_sync"}
    for phase in rec["phases"].values():
        _check_phase(phase, 2)
    single, ddp = rec["phases"]["single"], rec["phases"]["ddp"]
    assert ddp["step_ms"] == max(r["step_ms"] for r in ddp["per_rank"])  # the slowest rank sets the pace
    assert ddp["tokens_per_s"] == stored(2 * BATCH * SEQLEN / (ddp["step_ms"] / 1e3))
    assert single["tokens_per_s"] == stored(BATCH * SEQLEN / (single["step_ms"] / 1e3))
    assert rec["scaling_efficiency"] == stored(ddp["tokens_per_s"] / (2 * single["tokens_per_s"]))
    assert rec["exposed_comm_ms"] == stored(ddp["step_ms"] - rec["phases"]["no_sync"]["step_ms"])
    assert rec["allreduce"]["bytes"] == 4 * rec["parameters"] and rec["allreduce"]["ms"] > 0
    assert rec["overlap"] == stored(1 - rec["exposed_comm_ms"] / rec["allreduce"]["ms"])
    assert rec["stream_warnings"] == 0


def test_one_process(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # the script sets it for its workers; monkeypatch restores it after
    out = tmp_path / "scaling1.json"
    assert bench_scaling.main(_arguments(out, 1)) == 0
    assert capsys.readouterr().out.count("skipping backend triton") == 1
    data = json.loads(out.read_text())
    (rec,) = data["records"]
    assert set(rec["phases"]) == {"single"} and rec["world_size"] == 1
    _check_phase(rec["phases"]["single"], 1)
    assert "scaling_efficiency" not in rec and "allreduce" not in rec
