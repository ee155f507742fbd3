"""The step-time split on the CPU (host clock): the marks add up, are read late without loss, and a step
missing a boundary is refused rather than read; on a GPU, a CUDA graph replay keeps the tensors it captured alive."""

from __future__ import annotations

import time

import pytest
import torch

import kernels
from bench.step import TimedStep, alternate
from bench.timing import graph_replay
from lightning_modules.step_marks import Lagged, StepMarks
from model.mamba2 import Mamba2Config, Mamba2LM, next_token_loss

CPU = torch.device("cpu")


def _marks(sleep_s: float) -> StepMarks:
    marks = StepMarks(CPU)
    time.sleep(sleep_s)
    marks.mark("forward")
    time.sleep(sleep_s)
    marks.mark("backward")
    time.sleep(sleep_s)
    marks.end()
    return marks


def test_split_adds_up_to_the_step():
    split = _marks(0.01).read()
    assert split["step_ms"] == pytest.approx(split["forward_ms"] + split["backward_ms"] + split["optimizer_ms"])
    assert all(split[k] >= 9.0 for k in ("forward_ms", "backward_ms", "optimizer_ms"))  # each slept 10 ms
    assert "peak_gib" not in split  # no CUDA memory on the CPU


def test_lagged_reads_each_step_once_and_late():
    queue = Lagged(lag=2)
    assert queue.push(0, _marks(0)) == [] and queue.push(1, _marks(0)) == []
    ready = queue.push(2, _marks(0))
    assert [k for k, _ in ready] == [0]
    assert [k for k, _ in queue.push(3, _marks(0))] == [1]
    assert [k for k, _ in queue.drain()] == [2, 3] and queue.drain() == []
    assert [k for k, _ in Lagged(lag=0).push(7, _marks(0))] == [7]
    with pytest.raises(ValueError, match="lag"):
        Lagged(lag=-1)


def test_incomplete_step_is_refused():
    marks = StepMarks(CPU)
    marks.end()
    assert not marks.complete
    with pytest.raises(RuntimeError, match="lack one of"):
        marks.read()
    with pytest.raises(ValueError, match="unknown step boundary"):
        marks.mark("middle")


def test_timed_step_trains_and_keeps_each_steps_own_ssd_time():
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(vocab_size=50, d_model=32, n_layer=2, d_state=8, headdim=16, ssd_backend="torch"))
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = TimedStep(lambda t: next_token_loss(model, t), list(model.parameters()), opt, CPU)
    tokens = torch.randint(0, 50, (2, 33))
    kernels.ssd_timer.enabled = True
    try:
        first, second = step(tokens), step(tokens)
        assert step(tokens, timed=False) is None
    finally:
        kernels.ssd_timer.enabled = False
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    for marks in (first, second):  # read after both ran: each kept its own two layers' SSD marks
        assert len(marks.ssd.forward) == 2 and len(marks.ssd.backward) == 2
        split = marks.read()
        assert 0 < split["ssd_forward_ms"] < split["forward_ms"] and 0 < split["ssd_backward_ms"] < split["backward_ms"]
    # Kept between steps: fp32 parameters, their gradients, AdamW's step count and two moments per parameter.
    params = list(model.parameters())
    floats = 4 * sum(p.numel() for p in params) * 4  # parameter, gradient, exp_avg, exp_avg_sq
    steps = sum(s["step"].untyped_storage().nbytes() for s in opt.state.values())
    assert step.resident_gib() * 2**30 == floats + steps


def test_alternate_times_each_step_right_after_one_of_its_own():
    calls = []

    def step(name):
        def run(batch, timed=True):
            calls.append((name, int(batch), timed))
            return _marks(0) if timed else None

        return run

    batches = [torch.tensor(i) for i in range(3)]
    _, marks = alternate({"a": step("a"), "b": step("b")}, batches, 4, CPU)
    assert [len(m) for m in marks.values()] == [4, 4]
    assert len(calls) == 16
    for prev, this in zip(calls[::2], calls[1::2]):  # an untimed lead-in, then the same step timed on the same batch
        assert (prev[0], prev[1], prev[2], this[2]) == (this[0], this[1], False, True)
    assert [c[0] for c in calls[1::2]] == ["a", "b"] * 4  # the variants still alternate round by round
    assert [c[1] for c in calls[1::2]] == [0, 0, 1, 1, 2, 2, 0, 0]
    _, plain = alternate({"a": step("a")}, batches, 2, CPU, timed=False)
    assert plain == {"a": [None, None]} and all(not c[2] for c in calls[16:])


def test_code_fingerprint_names_the_code_not_its_caches(tmp_path):
    from lightning_modules.environment import code_fingerprint

    (tmp_path / "kernels" / "__pycache__").mkdir(parents=True)
    (tmp_path / "configs").mkdir()
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "kernels" / "ssd.py").write_text("A = 1\n")
    (tmp_path / "configs" / "tiny.yaml").write_text("model: {}\n")
    first = code_fingerprint(tmp_path)
    (tmp_path / "kernels" / "__pycache__" / "ssd.cpython-311.pyc").write_bytes(b"\x00compiled")
    (tmp_path / "kernels" / "notes.txt").write_text("not code\n")
    assert code_fingerprint(tmp_path) == first
    (tmp_path / "kernels" / "ssd.py").write_text("A = 2\n")
    assert code_fingerprint(tmp_path) != first
    (tmp_path / "kernels" / "ssd.py").write_text("A = 1\n")
    (tmp_path / "configs" / "tiny.yaml").write_text("model: {d_model: 8}\n")
    assert code_fingerprint(tmp_path) != first


def test_commit_is_only_read_from_this_projects_own_checkout(tmp_path):
    import subprocess

    from lightning_modules.environment import _git_commit

    outer = tmp_path / "outer"
    (outer / "copy" / "kernels").mkdir(parents=True)
    (outer / "copy" / "kernels" / "a.py").write_text("A = 1\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=outer, check=True)
    subprocess.run([*git, "add", "."], cwd=outer, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=outer, check=True)
    assert _git_commit(outer / "copy") is None  # a copy inside another repository has no commit of its own
    subprocess.run([*git, "init", "-q"], cwd=outer / "copy", check=True)
    subprocess.run([*git, "add", "."], cwd=outer / "copy", check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=outer / "copy", check=True)
    head = _git_commit(outer / "copy")
    assert head is not None and len(head) == 40
    (outer / "copy" / "kernels" / "a.py").write_text("A = 2\n")
    assert _git_commit(outer / "copy") == head + "+dirty"


def test_step_timer_gathers_per_rank_times_and_the_ranks_largest_memory_peaks():
    """Under DDP each record gets every rank's step time, their max, and the max over ranks of both memory
    peaks (allocated and reserved); a record without memory figures (a CPU) gets none."""
    from lightning_modules.step_timer import StepTimer

    class TwoRanks:  # all_gather as Lightning's: this rank's tensor and another rank's, stacked
        device = torch.device("cpu")

        def all_gather(self, local: torch.Tensor) -> torch.Tensor:
            other = local.clone()
            other[:, 0] += 10.0  # the other rank is 10 ms slower
            other[:, 1:] *= 2.0  # and holds twice the memory
            return torch.stack([local, other])

    timer = StepTimer()
    with_memory = {"time/step_ms": 100.0, "memory/peak_gib": 3.0, "memory/reserved_gib": 4.0}
    without = {"time/step_ms": 50.0}
    timer._ungathered = [(1, with_memory), (2, without)]
    timer._gather(TwoRanks())
    assert with_memory["time/step_ms_rank0"] == 100.0 and with_memory["time/step_ms_rank1"] == 110.0
    assert with_memory["time/step_ms_max"] == 110.0
    assert (with_memory["memory/peak_gib"], with_memory["memory/reserved_gib"]) == (6.0, 8.0)
    assert without["time/step_ms_max"] == 60.0 and "memory/peak_gib" not in without


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_keeps_what_it_captured_alive():
    """The replay holds the captured call, and with it the tensors only the call holds: once the allocator's cache
    is emptied (as the next capture does) and new memory is taken, a replay still reads the call's own input."""
    out = torch.empty(1 << 22, device="cuda")

    def capture():
        x = torch.full((1 << 22,), 3.0, device="cuda")  # held by the lambda alone
        return graph_replay(lambda: torch.mul(x, 2.0, out=out))

    replay = capture()
    out.zero_()  # the warm-up calls and the capture wrote it; the replay must write it again
    torch.cuda.empty_cache()
    _filler = torch.zeros(1 << 22, device="cuda")  # would take x's memory were x freed
    replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full_like(out, 6.0))
