"""kernels.cutile.tuning: one decision per shape, searched again when the space changes, forced and precompiling launches."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch


def test_tuning_choice_is_decided_once_per_shape(tmp_path, monkeypatch):
    """The launch path looks a tuned configuration up once; later calls touch neither the GPU nor the disk."""
    from kernels.cutile import tuning
    from kernels.cutile.compute_out import OutConfig

    lookups = []
    monkeypatch.setattr(tuning, "_gpu_key", lambda device: lookups.append(device) or "TestGPU|cuda-tile-x")
    tuning.set_cache_path(tmp_path / "tuning.json")
    try:
        (tmp_path / "tuning.json").write_text(
            '{"compute_out|s1|TestGPU|cuda-tile-x": {"config": {"TILE_T": 128, "TILE_P": 32, "latency": 4, '
            '"occupancy": 1}}}'
        )
        never = lambda: pytest.fail("no search when tuning is off")
        space = lambda: [OutConfig(), OutConfig(128, 32, 4, 1)]  # tuning off: only checks the cached entry
        for _ in range(3):
            assert tuning.choose("compute_out", "s1", OutConfig(), space, "cuda:0", None) == OutConfig(128, 32, 4, 1)
            assert tuning.choose("compute_out", "s2", OutConfig(), never, "cuda:0", None) == OutConfig()
        assert len(lookups) == 2  # one per shape
        assert tuning.chosen() == {  # what the process ran, for the record
            "compute_out|s1": {
                "config": dataclasses.asdict(OutConfig(128, 32, 4, 1)),
                "source": "cache",
                "mean_us": None,
            },
            "compute_out|s2": {"config": dataclasses.asdict(OutConfig()), "source": "default", "mean_us": None},
        }
        # An entry written for another layout of the configuration (a field since removed) is not used.
        (tmp_path / "tuning.json").write_text(
            '{"compute_out|s3|TestGPU|cuda-tile-x": {"config": {"TILE_T": 128, "TILE_P": 32, "stages": 2}}}'
        )
        tuning.set_cache_path(tmp_path / "tuning.json")
        assert tuning.choose("compute_out", "s3", OutConfig(), never, "cuda:0", None) == OutConfig()
        # Nor is one outside today's tune space (tuned by older code): tuning off, the default runs.
        (tmp_path / "tuning.json").write_text(
            '{"compute_out|s4|TestGPU|cuda-tile-x": {"config": {"TILE_T": 16, "TILE_P": 16, "latency": 4, '
            '"occupancy": 1}}}'
        )
        tuning.set_cache_path(tmp_path / "tuning.json")
        assert tuning.choose("compute_out", "s4", OutConfig(), space, "cuda:0", None) == OutConfig()
    finally:
        tuning.set_cache_path(None)


def fake_search(monkeypatch) -> list[list]:
    """cuda.tile.tune.exhaustive_search replaced by one that picks the last candidate at 1 us, on "TestGPU"; the
    list returned collects each search's candidates."""
    import types

    import cuda.tile.tune

    from kernels.cutile import tuning

    searched: list[list] = []

    def search(candidates, stream, **kwargs):
        searched.append(list(candidates))
        best = types.SimpleNamespace(config=candidates[-1], mean_us=1.0)
        return types.SimpleNamespace(best=best, successes=candidates, failures=[], summary=lambda top_k: "")

    monkeypatch.setattr(cuda.tile.tune, "exhaustive_search", search)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "TestGPU|cuda-tile-x")
    return searched


def test_tuning_searches_again_when_the_tune_space_changed(tmp_path, monkeypatch):
    """With tuning on, a cached choice is kept only if it was searched over today's tune space: one from a smaller
    space (as before fwd_pass_state's two-chunk walks joined its space) or from before spaces were recorded is
    searched again, and the new entry, recording its space, is then used as it is."""
    from kernels.cutile import tuning
    from kernels.cutile.compute_out import OutConfig

    searched = fake_search(monkeypatch)
    old = [OutConfig(), OutConfig(128, 32, 4, 1)]
    grown = [*old, OutConfig(64, 64)]
    entry = (
        '{"compute_out|s1|TestGPU|cuda-tile-x": {"config": {"TILE_T": 128, "TILE_P": 32, "latency": 4, '
        '"occupancy": 1}%s}}'
    )
    cache = tmp_path / "tuning.json"

    def choose() -> OutConfig:
        tuning.set_cache_path(cache)  # forgets the process's choices: the cache on disk decides
        searched.clear()
        return tuning.choose("compute_out", "s1", OutConfig(), lambda: grown, "cuda:0", lambda cfg: ((), None, ()))

    tuning.set_autotune(True)
    try:
        for recorded in ("", f', "space": "{tuning.space_id(old)}"'):  # no space recorded; a smaller one
            cache.write_text(entry % recorded)
            assert choose() == OutConfig(64, 64) and searched == [grown]
            assert choose() == OutConfig(64, 64) and searched == []  # the stored entry, searched over today's space
        cache.write_text(entry % f', "space": "{tuning.space_id(grown)}"')
        assert choose() == OutConfig(128, 32, 4, 1) and searched == []
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)


def test_precompiling_launches_the_nth_candidate_and_remembers_nothing(tmp_path, monkeypatch):
    """tuning.precompiling(k) makes every launch run the k-th configuration of its tune space (the default past
    its end), reports each space's size, neither tunes nor writes the cache, and leaves tuning as it was."""
    from kernels.cutile import tuning
    from kernels.cutile.bwd_dx import DxConfig
    from kernels.cutile.compute_out import OutConfig

    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "TestGPU|cuda-tile-x")
    tuning.set_cache_path(tmp_path / "tuning.json")
    outs = [OutConfig(TILE_T=t) for t in (16, 32, 64)]
    never = lambda: pytest.fail("no search when tuning is off")
    try:
        tuning.set_autotune(True)  # on: precompiling must still not search
        for k, want in ((0, outs[0]), (2, outs[2]), (3, OutConfig())):
            with tuning.precompiling(k) as sizes:
                assert tuning.choose("compute_out", "s1", OutConfig(), lambda: outs, "cuda:0", None) == want
                assert tuning.choose("bwd_dx", "s1", DxConfig(), lambda: [DxConfig(1)], "cuda:0", None) == (
                    DxConfig(1) if k == 0 else DxConfig()
                )
            assert sizes == {"compute_out": 3, "bwd_dx": 1}
        assert tuning.chosen() == {} and not (tmp_path / "tuning.json").exists()
        tuning.set_autotune(False)
        assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == OutConfig()
        with pytest.raises(ValueError, match="index must be >= 0"), tuning.precompiling(-1):
            pass
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)


def test_a_forced_configuration_replaces_tuning_for_its_stage_only(tmp_path, monkeypatch):
    """tuning.forced pins one stage's configuration within its block, records what each launch of that stage
    ran, leaves other stages to tuning, and restores tuning's choice after the block."""
    from kernels.cutile import tuning
    from kernels.cutile.bwd_dx import DxConfig
    from kernels.cutile.compute_out import OutConfig

    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "TestGPU|cuda-tile-x")
    tuning.set_cache_path(tmp_path / "tuning.json")
    never = lambda: pytest.fail("no search when tuning is off")
    pinned = OutConfig(TILE_T=32)
    try:
        with tuning.forced("compute_out", pinned) as launched:
            assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == pinned
            assert tuning.choose("bwd_dx", "s1", DxConfig(), never, "cuda:0", None) == DxConfig()
            with tuning.forced("compute_out") as inner:  # None: record what tuning chooses
                assert tuning.choose("compute_out", "s2", OutConfig(), never, "cuda:0", None) == OutConfig()
            assert tuning.choose("compute_out", "s2", OutConfig(), never, "cuda:0", None) == pinned
        assert launched == [pinned, pinned] and inner == [OutConfig()]
        assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == OutConfig()
        # A pinned configuration is not tuned first (tuning on: `never` would fail), and an error inside the
        # block leaves nothing pinned.
        tuning.set_autotune(True)
        with pytest.raises(RuntimeError, match="inside"), tuning.forced("compute_out", pinned):
            assert tuning.choose("compute_out", "s9", OutConfig(), never, "cuda:0", None) == pinned
            raise RuntimeError("inside")
        tuning.set_autotune(False)
        assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == OutConfig()
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)


def test_shipped_table_is_used_after_the_cache_and_only_inside_todays_space(tmp_path, monkeypatch):
    """The shipped table answers a shape the local cache lacks, tuning off or on (then only if it was searched over
    today's space, with no search); the local cache wins over it; an entry outside today's space is not used."""
    from kernels.cutile import tuning
    from kernels.cutile.compute_out import OutConfig

    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "TestGPU|cuda-tile-x")
    space = lambda: [OutConfig(), OutConfig(128, 32, 4, 1), OutConfig(64, 64, 4, 2)]
    shipped = {
        "compute_out|s1|TestGPU|cuda-tile-x": {"config": dataclasses.asdict(OutConfig(128, 32, 4, 1)), "mean_us": 5.0},
        "compute_out|s2|TestGPU|cuda-tile-x": {"config": dataclasses.asdict(OutConfig(64, 64, 4, 2))},
        "compute_out|s3|TestGPU|cuda-tile-x": {"config": dataclasses.asdict(OutConfig(16, 16, 4, 1))},
        "compute_out|s4|TestGPU|cuda-tile-x": {
            "config": dataclasses.asdict(OutConfig(64, 64, 4, 2)),
            "space": tuning.space_id(space()),
        },
    }
    (tmp_path / "tuned.json").write_text(json.dumps(shipped))
    (tmp_path / "tuning.json").write_text(
        json.dumps({"compute_out|s2|TestGPU|cuda-tile-x": shipped["compute_out|s1|TestGPU|cuda-tile-x"]})
    )
    never = lambda cfg: pytest.fail("no search: the shipped table answers")
    try:
        tuning.set_cache_path(tmp_path / "tuning.json")
        tuning.set_shipped_path(tmp_path / "tuned.json")
        assert tuning.choose("compute_out", "s1", OutConfig(), space, "cuda:0", None) == OutConfig(128, 32, 4, 1)
        assert tuning.choose("compute_out", "s2", OutConfig(), space, "cuda:0", None) == OutConfig(128, 32, 4, 1)
        assert tuning.choose("compute_out", "s3", OutConfig(), space, "cuda:0", None) == OutConfig()
        # with document boundaries, a shape the table lacks starts from its entry without them
        assert tuning.choose("compute_out", "s1_seq_idx", OutConfig(), space, "cuda:0", None) == OutConfig(
            128, 32, 4, 1
        )
        assert tuning.choose("compute_out", "s5_seq_idx", OutConfig(), space, "cuda:0", None) == OutConfig()
        assert {k: v["source"] for k, v in tuning.chosen().items()} == {
            "compute_out|s1": "shipped",
            "compute_out|s2": "cache",
            "compute_out|s3": "default",
            "compute_out|s1_seq_idx": "shipped",
            "compute_out|s5_seq_idx": "default",
        }
        assert tuning.chosen()["compute_out|s1"]["mean_us"] == 5.0
        tuning.set_autotune(True)
        assert tuning.choose("compute_out", "s4", OutConfig(), space, "cuda:0", never) == OutConfig(64, 64, 4, 2)
        assert tuning.chosen()["compute_out|s4"]["source"] == "shipped"
        assert not (tmp_path / "tuning.json").read_text().count("s4")  # nothing searched, nothing stored
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)
        tuning.set_shipped_path(None)


def test_tuning_searches_a_key_with_document_boundaries(tmp_path, monkeypatch):
    """Tuning off, a "_seq_idx" key the tables lack borrows its shape's shipped entry without boundaries; tuning on,
    it is searched (its build is another, with other spills) even though that entry was searched over today's
    space, and the search's choice is stored under the "_seq_idx" key."""
    from kernels.cutile import tuning
    from kernels.cutile.compute_out import OutConfig

    searched = fake_search(monkeypatch)
    space = lambda: [OutConfig(), OutConfig(128, 32, 4, 1), OutConfig(64, 64, 4, 2)]
    entry = {"config": dataclasses.asdict(OutConfig(128, 32, 4, 1)), "space": tuning.space_id(space())}
    (tmp_path / "tuned.json").write_text(json.dumps({"compute_out|s1|TestGPU|cuda-tile-x": entry}))
    spec = lambda cfg: ((), None, ())
    try:
        tuning.set_cache_path(tmp_path / "tuning.json")
        tuning.set_shipped_path(tmp_path / "tuned.json")
        assert tuning.choose("compute_out", "s1_seq_idx", OutConfig(), space, "cuda:0", spec) == OutConfig(
            128, 32, 4, 1
        )
        assert searched == [] and tuning.chosen()["compute_out|s1_seq_idx"]["source"] == "shipped"
        tuning.set_cache_path(tmp_path / "tuning.json")  # forgets the process's choices
        tuning.set_autotune(True)
        assert tuning.choose("compute_out", "s1_seq_idx", OutConfig(), space, "cuda:0", spec) == OutConfig(64, 64, 4, 2)
        assert searched == [space()] and tuning.chosen()["compute_out|s1_seq_idx"]["source"] == "search"
        assert tuning.choose("compute_out", "s1", OutConfig(), space, "cuda:0", spec) == OutConfig(128, 32, 4, 1)
        assert len(searched) == 1  # the key without boundaries: its shipped entry, searched over today's space
        stored = json.loads((tmp_path / "tuning.json").read_text())
        assert stored["compute_out|s1_seq_idx|TestGPU|cuda-tile-x"]["config"] == dataclasses.asdict(
            OutConfig(64, 64, 4, 2)
        )
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)
        tuning.set_shipped_path(None)


def test_the_shipped_table_fills_each_kernels_config_class():
    """Every entry of kernels/cutile/tuned.json gives exactly the fields of its kernel's config class, as _decide
    reads it: an entry that no longer fits (a field renamed or added) would silently stop being used."""
    from kernels.cutile import (
        bwd_dbc,
        bwd_dx,
        causal_conv,
        chunk_cumsum,
        chunk_cumsum_bwd,
        compute_out,
        fwd_pass_state,
        rms_norm,
        tuning,
    )

    classes = {
        "bwd_dbc": bwd_dbc.DbcConfig,
        "bwd_dx": bwd_dx.DxConfig,
        "chunk_cumsum": chunk_cumsum.CumsumConfig,
        "chunk_cumsum_bwd": chunk_cumsum_bwd.CumsumBwdConfig,
        "compute_out": compute_out.OutConfig,
        "fwd_pass_state": fwd_pass_state.StateConfig,
        "state_walks": fwd_pass_state.StateConfig,
        "conv_fwd": causal_conv.ConvConfig,
        "conv_bwd": causal_conv.ConvConfig,
        "conv_bwd_dx": causal_conv.ConvConfig,
        "norm_fwd": rms_norm.NormConfig,
        "norm_bwd": rms_norm.NormConfig,
    }
    table = json.loads(tuning.SHIPPED.read_text())
    assert {key.split("|")[0] for key in table} == set(classes)  # every kernel of the medium step, tuned
    for key, entry in table.items():
        kernel, shape, gpu, version = key.split("|")
        assert shape and gpu and version.startswith("cuda-tile-"), key
        assert set(entry["config"]) == {f.name for f in dataclasses.fields(classes[kernel])}, key
        classes[kernel](**entry["config"])
