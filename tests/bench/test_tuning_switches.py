"""bench.tuning_switches: what --sweep and --shipped_table do to cuTile's tuning."""

from __future__ import annotations

import argparse
import json
import logging

import pytest

from bench import bench_kernels
from bench.tuning_switches import add_table_arguments, apply_table_arguments
from kernels.cutile import tuning
from kernels.cutile.compute_out import OutConfig
from tests.kernels.test_tuning import fake_search


@pytest.fixture
def fresh_tuning():
    """Tuning's process state put back as the defaults after the test."""
    yield
    tuning.set_cache_path(None)
    tuning.set_shipped_path(None)
    tuning.set_autotune(False)
    tuning.log.setLevel(logging.NOTSET)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--autotune", action=argparse.BooleanOptionalAction, default=None)
    add_table_arguments(ap)
    return ap


def test_sweep_searches_a_shape_the_cache_holds_and_prints_every_configuration(
    tmp_path, monkeypatch, caplog, fresh_tuning
):
    searched = fake_search(monkeypatch)
    space = [OutConfig(), OutConfig(128, 32, 4, 1)]
    user_cache = tmp_path / "mamba2-cutile" / "tuning.json"
    user_cache.parent.mkdir()
    held = {"compute_out|s1|TestGPU|cuda-tile-x": {"config": vars(OutConfig()), "space": tuning.space_id(space)}}
    user_cache.write_text(json.dumps(held))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def choose() -> OutConfig:
        return tuning.choose("compute_out", "s1", OutConfig(), lambda: space, "cuda:0", None)

    ap = parser()
    plain = ap.parse_args(["--autotune"])
    apply_table_arguments(ap, plain)
    tuning.set_autotune(True)
    assert choose() == OutConfig() and searched == []  # from the user's cache

    args = ap.parse_args(["--sweep"])
    with caplog.at_level(logging.INFO, logger=tuning.log.name):
        apply_table_arguments(ap, args)
        assert choose() == OutConfig(128, 32, 4, 1)  # the fake search's pick
    assert args.autotune is True and args.shipped_table == "none" and searched == [space]
    assert "compute_out on s1, every configuration" in caplog.text
    assert json.loads(user_cache.read_text()) == held  # untouched
    assert "compute_out|s1|TestGPU|cuda-tile-x" in json.loads(open(args.tuning_cache).read())


@pytest.mark.parametrize("extra", [["--no-autotune"], ["--shipped_table", "tuned.json"]])
def test_sweep_refuses_what_contradicts_it(extra, capsys, fresh_tuning):
    ap = parser()
    args = ap.parse_args(["--sweep", *extra])
    with pytest.raises(SystemExit) as stop:
        apply_table_arguments(ap, args)
    assert stop.value.code == 2 and "--sweep searches with no shipped table" in capsys.readouterr().err


def test_bench_kernels_takes_the_table_switches(tmp_path, fresh_tuning):
    out = tmp_path / "k.json"
    argv = ["--shapes", "tiny", "--backends", "torch", "--modes", "fwd", "--repeats", "1", "--calls", "1"]
    assert bench_kernels.main([*argv, "--sweep", "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["sweep"] and settings["autotune"] and settings["shipped_table"] == "none"
    assert str(tuning.cache_path()) == settings["tuning_cache"] != str(tmp_path)
    assert bench_kernels.main([*argv, "--shipped_table", "none", "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert not settings["sweep"] and not settings["autotune"] and settings["tuning_cache"] is None
