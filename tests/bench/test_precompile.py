"""bench/precompile.py: every candidate of every tune space goes to exactly one worker, and bad input is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_workers_share_out_every_candidate_of_every_space(monkeypatch):
    from bench import precompile
    from kernels.cutile import tuning

    spaces = {"fwd_pass_state": ["a0", "a1", "a2", "a3", "a4"], "bwd_dx": ["b0", "b1"]}
    launched: list[tuple[str, str]] = []
    walks: set[str] = set()

    def fake_call(shape, mode, walks_mode):
        walks.add(walks_mode)

        def call():
            for name, space in spaces.items():
                launched.append((name, tuning.choose(name, "key", "default", lambda s=space: s, "cuda:0", None)))

        return call

    monkeypatch.setattr(precompile, "cutile_call", fake_call)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    got = {}
    for worker in range(3):
        launched.clear()
        precompile.cutile_worker(precompile.shapes_of("seed"), ["fwd", "fwd_bwd"], worker, 3, "one stream")
        got[worker] = {cfg for _, cfg in launched}
    assert got == {
        0: {"a0", "b0", "a3", "default"},
        1: {"a1", "b1", "a4", "default"},
        2: {"a2", "default"},
    }
    assert tuning.chosen() == {}  # nothing decided for later launches
    assert walks == {"one stream"}  # the backward's walks run as --walks says


def test_layers_launch_the_block_once_per_candidate_instead_of_the_ssd(monkeypatch):
    from bench import precompile
    from kernels.cutile import tuning

    launched: list[str] = []

    def fake_block(shape):
        def call():
            launched.append(tuning.choose("conv_fwd", "key", "default", lambda: ["c0", "c1", "c2"], "cuda:0", None))

        return call

    monkeypatch.setattr(precompile, "block_call", fake_block)
    monkeypatch.setattr(precompile, "cutile_call", lambda *a: (_ for _ in ()).throw(AssertionError("the SSD alone")))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    precompile.cutile_worker(precompile.shapes_of("step", "stdlib"), ["fwd"], 1, 2, "one stream", layers=True)
    assert launched == ["c1"]  # worker 1 of 2: the second candidate, once (modes do not multiply the block)


def test_bad_arguments_get_one_line(tmp_path):
    for args, message in (
        (
            ["--shapes", "nope"],
            "precompile: --shapes: unknown 'nope'; choose from seed, step, step_l8192, sweep, tiny, sweep_n64, sweep_n128",
        ),
        (["--jobs", "0"], "precompile: --jobs must be at least 1, got 0"),
        (["--modes", "fwd,bwd"], "precompile: --modes: choose from fwd, fwd_bwd, got 'fwd,bwd'"),
        (["--walks", "two"], "precompile: --walks: choose from aside, one stream, one launch, got 'two'"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "bench.precompile", *args], cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 2 and done.stderr.strip() == message


def test_workers_run_at_once_report_their_lines_and_are_killed_past_the_timeout(monkeypatch, capsys):
    from bench import precompile

    def worker(code: str) -> list[str]:
        return [sys.executable, "-c", code]

    commands = {
        "0": worker("import os; print('precompile: on GPU', os.environ['CUDA_VISIBLE_DEVICES']); print('noise')"),
        "1": worker("import os, sys; print('precompile: on GPU', os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(3)"),
        "2": worker("import time; print('precompile: started', flush=True); time.sleep(60)"),
    }
    failed = precompile.run_workers(commands, ["4", "5"], timeout=5)
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if "(" not in line]  # each worker's own lines, in worker order
    assert lines == ["precompile: on GPU 4", "precompile: on GPU 5", "precompile: started"]
    assert "worker 0 exited 0" in out and "worker 1 exited 3" in out and "worker 2 killed after --timeout" in out
    assert failed == ["1", "2"] and "noise" not in out
    assert "precompile: on GPU 5" in err and "noise" not in err  # a failed worker's output goes to stderr
