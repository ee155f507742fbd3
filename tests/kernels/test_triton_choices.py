"""The shipped Triton autotune choices: recorded from autotuners, written per GPU and versions, seeded back."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kernels import triton_choices

VERSIONS = {"mamba_ssm": "2.3.2.post1", "triton": "3.6.0"}


def tuner(configs: list[str], cache: dict | None = None) -> SimpleNamespace:
    """An object with triton Autotuner's two fields the table reads and writes."""
    return SimpleNamespace(configs=configs, cache=dict(cache or {}))


def test_recorded_choices_seed_fresh_autotuners_through_the_file(tmp_path):
    path = tmp_path / "table.json"
    tuned = {
        "ssd_bmm._bmm_chunk_fwd_kernel": tuner(["a", "b", "c"], {(256, 64, True, "torch.bfloat16"): "c"}),
        "ssd_chunk_scan._chunk_scan_fwd_kernel": tuner(["x", "y"], {(256, 64, 128, "torch.float32"): "x"}),
        "ssd_state_passing._state_passing_fwd_kernel": tuner(["p", "q"]),  # never ran: no row
    }
    rows = triton_choices.recorded(tuned)
    assert set(rows) == {"ssd_bmm._bmm_chunk_fwd_kernel", "ssd_chunk_scan._chunk_scan_fwd_kernel"}
    triton_choices.write(path, "NVIDIA H200", VERSIONS, rows)
    triton_choices.write(path, "Other GPU", VERSIONS, {})  # another GPU's entry leaves this one alone

    fresh = {name: tuner(t.configs) for name, t in tuned.items()}
    count = triton_choices.seed(fresh, triton_choices.read(path, "NVIDIA H200", VERSIONS))
    assert count == 2
    for name, t in tuned.items():
        assert fresh[name].cache == t.cache  # the same config objects under the same key tuples
    assert (
        fresh["ssd_bmm._bmm_chunk_fwd_kernel"].cache[(256, 64, True, "torch.bfloat16")]
        is tuned["ssd_bmm._bmm_chunk_fwd_kernel"].configs[2]
    )


@pytest.mark.parametrize(
    "gpu, versions",
    [("NVIDIA B300", VERSIONS), ("NVIDIA H200", {**VERSIONS, "triton": "3.7.0"})],
    ids=["other GPU", "other triton"],
)
def test_a_table_of_another_gpu_or_version_seeds_nothing(tmp_path, gpu, versions):
    path = tmp_path / "table.json"
    triton_choices.write(path, "NVIDIA H200", VERSIONS, {"k": [[[64, "torch.bfloat16"], 1]]})
    assert triton_choices.read(path, gpu, versions) == {}
    assert triton_choices.read(tmp_path / "absent.json", "NVIDIA H200", VERSIONS) == {}


def test_seed_skips_unknown_kernels_bad_indices_and_decided_keys():
    tuners = {"k": tuner(["a", "b"], {(1,): "a"})}
    rows = {"k": [[[1], 1], [[2], 5], [[3], 1]], "gone": [[[1], 0]]}
    assert triton_choices.seed(tuners, rows) == 1
    assert tuners["k"].cache == {(1,): "a", (3,): "b"}


def test_the_shipped_table_is_well_formed():
    table = json.loads(triton_choices.SHIPPED.read_text())
    assert table, "kernels/triton_tuned.json holds no GPU"
    for gpu, entry in table.items():
        assert set(entry["versions"]) == set(VERSIONS), gpu
        assert entry["kernels"], gpu
        for name, rows in entry["kernels"].items():
            assert name.startswith("ssd_") and "." in name
            assert all(isinstance(key, list) and isinstance(index, int) and index >= 0 for key, index in rows)
