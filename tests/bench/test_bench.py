"""The measuring instruments' plumbing on the CPU: the benchmark scripts, run as a user runs them, on tiny
shapes and the torch backend, write valid JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import default_sigint, stored

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{script.removesuffix('.py')}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _strict_json(text: str):
    """json.loads that refuses NaN and Infinity, which Python writes but JSON does not have."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_bench_kernels_writes_json(tmp_path):
    out = tmp_path / "k.json"
    _run(
        "bench_kernels.py",
        *("--shapes", "tiny", "--backends", "torch,cutile", "--repeats", "2", "--calls", "2", "--out", str(out)),
        *("--documents", "short"),
    )
    data = _strict_json(out.read_text())
    assert data["kind"] == "bench_kernels" and data["environment"]["torch"]
    assert "cutile" in data["settings"]["skipped"]
    modes = {r["mode"] for r in data["records"]}
    assert modes == {"fwd", "fwd_bwd"}
    for r in data["records"]:
        assert r["backend"] == "torch" and r["wall_ms"]["median"] > 0 and r["wall_ms"]["n"] == 2
        assert r["shape"]["documents"] == "short"  # packed documents: seq_idx went to every call
        if torch.cuda.is_available():
            assert r["gpu_ms"] > 0 and r["GBps_gpu"] > 0
        else:  # no kernel time off GPU: null, and nothing derived from it
            assert r["gpu_ms"] is None and r["GBps_gpu"] is None and r["TFLOPs_gpu"] is None
    assert data["tuning"] == {}  # no cuTile kernel ran


def test_bench_kernels_times_a_forward_for_a_backend_asked_for_only_with_its_backward():
    """`--backends cutile:cutile,triton` still times the cuTile forward (as "cutile"): the backward's share is
    forward + backward less forward, both from one process. Here the torch backend stands in for cutile."""
    from bench import bench_kernels

    assert bench_kernels.forward_variants(["cutile:cutile", "triton", "cutile"]) == ["cutile", "triton"]
    records = bench_kernels.bench_shape(bench_kernels.TINY[0], ["torch:cutile"], ["fwd"], 1, 1, "cpu")
    assert [(r["mode"], r["backend"], r["backward"]) for r in records] == [("fwd", "torch", "reference")]


def test_bench_kernels_backward_shares_subtract_each_backends_forward():
    from bench import bench_kernels

    def rec(mode, backend, backward, gpu_ms):  # as bench_shape writes them, at one shape
        shape = {"batch": 1, "seqlen": 96}
        return {"mode": mode, "backend": backend, "backward": backward, "gpu_ms": gpu_ms, "shape": shape} | {
            "wall_ms": {"median": 1.0 if gpu_ms is None else 2 * gpu_ms}
        }

    records = [
        rec("fwd", "cutile", "reference", 0.2),
        rec("fwd", "triton", "reference", 0.3),
        rec("fwd_bwd", "cutile", "cutile", 0.6),
        rec("fwd_bwd", "cutile", "reference", 7.2),
        rec("fwd_bwd", "triton", "reference", 1.1),
    ]
    rows = bench_kernels.backward_shares(records)
    assert [(name, round(ms, 6), None if r is None else round(r, 6)) for name, ms, r in rows] == [
        ("cutile:cutile", 0.4, 2.0),
        ("cutile", 7.0, round(0.8 / 7.0, 6)),
        ("triton", 0.8, None),
    ]
    assert bench_kernels.backward_shares([rec("fwd_bwd", "torch", "reference", None)]) == []  # off GPU: no times


def test_bench_kernels_refuses_unknown_modes_and_shapes_in_one_line(tmp_path):
    for option, value, unknown in (("--modes", "fwd,bogus", "'bogus'"), ("--shapes", "seed,huge", "'huge'")):
        done = subprocess.run(
            [sys.executable, "-m", "bench.bench_kernels", option, value, "--out", str(tmp_path / "k.json")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
        assert done.stderr.strip().splitlines() == [
            f"bench_kernels.py: error: {option}: unknown {unknown}; choose from "
            + ("fwd, fwd_bwd" if option == "--modes" else "seed, step, step_l8192, sweep, tiny, sweep_n64, sweep_n128")
        ]
        assert not (tmp_path / "k.json").exists()


def test_bench_step_writes_json(tmp_path):
    out = tmp_path / "s.json"
    _run(
        "bench_step.py",
        *("--configs", "tiny", "--seqlens", "64", "--tokens_per_step", "128"),
        *("--backends", "torch,standin,standin+conv+norm", "--modes", "eager", "--steps", "2", "--warmup", "1"),
        *("--out", str(out), "--documents", "short"),
    )
    data = json.loads(out.read_text())
    rows = {r["variant"]: r for r in data["records"]}
    assert rows.keys() == {"torch", "standin"}  # standin+conv+norm needs cuTile: skipped here, and said why
    assert data["settings"]["variants"] == ["torch", "standin"] and "cutile" in data["settings"]["skipped"]
    assert {(r["config"]["conv_backend"], r["config"]["norm_backend"]) for r in rows.values()} == {("torch", "torch")}
    torch_row, standin = rows["torch"], rows["standin"]
    assert (torch_row["backend"], torch_row["backward"], standin["backend"]) == ("torch", "reference", "standin")
    assert torch_row["size"] == "tiny" and torch_row["batch"] == 2 and torch_row["config"]["d_model"] == 128
    assert torch_row["documents"] == "short"
    assert torch_row["parameters"] == standin["parameters"]  # same model, only the SSD differs
    m = torch_row["median"]
    assert m["step_ms"] >= m["forward_ms"] > 0 and m["ssd_forward_ms"] > 0 and m["ssd_backward_ms"] > 0
    # two steps: each median is the mean of two, so the split adds up as it does per step
    assert m["step_ms"] == stored(m["forward_ms"] + m["backward_ms"] + m["optimizer_ms"])
    assert 0 < torch_row["ssd_share"] < 1 and torch_row["tokens_per_s"] > 0
    # the stand-in runs through kernels.ssd as a backend (y = x·D), timed as any backend is
    assert 0 < standin["median"]["ssd_forward_ms"] < m["ssd_forward_ms"] and "ssd_ms_by_subtraction" not in standin
    assert torch_row["ssd_ms_by_subtraction"] == stored(m["step_ms"] - standin["median"]["step_ms"])
    assert torch_row["train_flops_per_token"] > 0
    # the marked loop against the mean of an unmarked loop before and after it
    loops = torch_row["timer_loops_ms"]
    assert sorted(loops) == ["plain_after", "plain_before", "timed"] and min(loops.values()) > 0
    mean_plain = (loops["plain_before"] + loops["plain_after"]) / 2
    assert torch_row["timer_cost"] == stored(loops["timed"] / mean_plain - 1)


def test_bench_step_refuses_unknown_variants():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_step",
            "--backends",
            "torch,triton+fast,triton+conv+conv",
            "--configs",
            "tiny",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 2 and "unknown variants ['triton+fast', 'triton+conv+conv']" in done.stderr.splitlines()[-1]
    )


def test_ab_kernels_runs_each_tree_in_its_own_process(tmp_path):
    bad = tmp_path / "bad" / "kernels"
    bad.mkdir(parents=True)
    (bad / "__init__.py").write_text("raise SystemExit('this tree was imported')\n")
    out = tmp_path / "ab"
    bench = ("--shapes", "tiny", "--backends", "torch", "--modes", "fwd", "--repeats", "2", "--calls", "2")
    done = subprocess.run(
        ["bash", "bench/ab_kernels.sh", str(out), "2", f"work={ROOT}", f"bad={bad.parent}", "--", *bench],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    order = [line.split()[1:4] for line in done.stderr.splitlines() if line.startswith("ab_kernels:")]
    assert [o[0] + o[2] for o in order] == ["work1", "bad1", "work2", "bad2"]
    for r in (1, 2):
        assert _strict_json((out / f"work_{r}.json").read_text())["records"][0]["backend"] == "torch"
        assert not (out / f"bad_{r}.json").exists()
        assert "this tree was imported" in (out / f"bad_{r}.log").read_text()


@pytest.mark.parametrize(
    ("rounds", "trees", "message"),
    [
        ("1", ["a={root}", "b={tmp}"], "{tmp} holds no kernels package"),
        ("0", ["a={root}", "b={root}"], "ROUNDS must be a positive whole number, got '0'"),
        ("x", ["a={root}", "b={root}"], "ROUNDS must be a positive whole number, got 'x'"),
        ("1", ["a={root}", "a={root}"], "the name a is given twice"),
        ("1", ["a/b={root}", "c={root}"], "'a/b={root}' is not NAME=TREE"),
    ],
)
def test_ab_kernels_refuses_bad_arguments_before_running(tmp_path, rounds, trees, message):
    args = [t.format(root=ROOT, tmp=tmp_path) for t in trees]
    done = subprocess.run(
        ["bash", "bench/ab_kernels.sh", str(tmp_path / "ab"), rounds, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("ab_kernels: " + message.format(root=ROOT, tmp=tmp_path)), done.stderr
    assert not (tmp_path / "ab").exists()


def test_ab_kernels_stops_at_ctrl_c(tmp_path):
    out = tmp_path / "ab"
    bench = ("--shapes", "tiny", "--backends", "torch", "--modes", "fwd", "--repeats", "2", "--calls", "2")
    proc = subprocess.Popen(
        ["bash", "bench/ab_kernels.sh", str(out), "3", f"a={ROOT}", f"b={ROOT}", "--", *bench],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / "a_1.log").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # inside the first benchmark process (importing torch takes longer)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole group
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr.read().strip().splitlines()[-1] == "ab_kernels: interrupted"
    assert not (out / "a_1.json").exists()  # the running benchmark was stopped, not waited for
    assert not (out / "b_1.log").exists()


@pytest.mark.slow  # waits for a test stuck on purpose to be stopped by its time limit
def test_gpu_check_names_the_stuck_test_and_where_it_waits(tmp_path):
    """gpu_check.sh on a selection whose third test never ends: the job times out, and the report names that
    test and the frame it waits in (from the stack dump pytest's faulthandler_timeout writes); the skipped test
    is printed with its reason."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_stuck.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_quick():\n    pass\n\n\n"
        "@pytest.mark.gpu\ndef test_skipped():\n    pytest.skip('needs two GPUs')\n\n\n"
        "@pytest.mark.gpu\ndef test_stuck():\n    time.sleep(120)\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "GPU_CHECK_TIMEOUT": "20", "GPU_CHECK_STACK": "3"}
    done = subprocess.run(
        ["bash", str(ROOT / "bench/gpu_check.sh"), str(tmp_path / "out"), "1", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu_check:  1 PASSED 1 SKIPPED no outcome 1" in done.stdout
    assert "gpu_check: tests/test_stuck.py::test_skipped SKIPPED (needs two GPUs)\n" in done.stdout
    report = done.stdout.split("gpu_check: job0 timed out in tests/test_stuck.py::test_stuck\n", 1)[1]
    assert 'test_stuck.py", line 17 in test_stuck' in report.splitlines()[0]


def test_bench_step_keeps_the_other_rows_when_a_variant_fails(tmp_path, monkeypatch, capsys):
    """A variant failing in warm-up (here the standin backend raising) costs its row, recorded with its error and
    printed as one line; the other variants of the cell are measured."""
    import kernels
    from bench import bench_step

    def broken(*args, **kwargs):
        raise RuntimeError("stand-in broken on purpose")

    backend_of = kernels.implementation
    monkeypatch.setattr(kernels, "implementation", lambda name: broken if name == "standin" else backend_of(name))
    out = tmp_path / "s.json"
    argv = ["--configs", "tiny", "--seqlens", "64", "--tokens_per_step", "128", "--backends", "torch,standin"]
    assert bench_step.main([*argv, "--modes", "eager", "--steps", "1", "--warmup", "1", "--out", str(out)]) == 0
    records = json.loads(out.read_text())["records"]
    assert [r["variant"] for r in records if "error" not in r] == ["torch"]
    (failed,) = [r for r in records if "error" in r]
    assert failed["variant"] == "standin" and "stand-in broken on purpose" in failed["error"]
    assert failed["mode"] == "eager" and failed["size"] == "tiny"
    assert "FAILED tiny L=64 standin: RuntimeError: stand-in broken on purpose" in capsys.readouterr().out


def test_bench_step_measures_documents_kinds_side_by_side(tmp_path, monkeypatch, capsys):
    """`--documents none,short`: every variant once per kind in one loop, each row with its kind's seq_idx (short
    documents at L 256: boundaries inside every row), subtraction pairing a row with the standin of its kind."""
    from bench import bench_step

    seen: dict[int, set] = {}  # model -> the documents it was given: None, or the rows' last document ids

    def spy(model, tokens, seq_idx=None):
        seen.setdefault(id(model), set()).add(None if seq_idx is None else tuple(seq_idx[:, -1].tolist()))
        return next_token_loss(model, tokens, seq_idx)

    next_token_loss = bench_step.next_token_loss
    monkeypatch.setattr(bench_step, "next_token_loss", spy)
    out = tmp_path / "s.json"
    argv = ["--configs", "tiny", "--seqlens", "256", "--tokens_per_step", "512", "--backends", "torch,standin"]
    argv += ["--modes", "eager", "--steps", "2", "--warmup", "1", "--documents", "none,short", "--out", str(out)]
    assert bench_step.main(argv) == 0
    records = json.loads(out.read_text())["records"]
    rows = {(r["variant"], r["documents"]): r for r in records}
    assert len(records) == 4 and rows.keys() == {(v, d) for v in ("torch", "standin") for d in ("none", "short")}
    assert sorted(map(len, seen.values())) == [1] * 4  # each row's model always got its one kind's documents
    assert sorted((k for ks in seen.values() for k in ks), key=str) == [(1, 2), (1, 2), None, None]
    for kind in ("none", "short"):
        torch_row, standin = rows["torch", kind], rows["standin", kind]
        subtracted = torch_row["median"]["step_ms"] - standin["median"]["step_ms"]
        assert torch_row["ssd_ms_by_subtraction"] == stored(subtracted)
    printed = capsys.readouterr().out
    assert " torch@short " in printed and " standin@short " in printed and " torch@none " not in printed
    for bad, problem in (("none,bogus", "unknown 'bogus'"), ("short,short", "'short' given twice")):
        with pytest.raises(SystemExit) as exit_:
            bench_step.main([*argv[:-4], "--documents", bad, "--out", str(tmp_path / "bad.json")])
        assert exit_.value.code == 2
        assert (
            capsys.readouterr()
            .err.splitlines()[-1]
            .endswith(f"error: --documents: {problem}; choose from none, stdlib, short, each once")
        )
    assert not (tmp_path / "bad.json").exists()


def test_gpu_time_counts_overlapping_kernels_once():
    """GPU time is the union of the kernels' intervals: kernels on two streams at once count once, gaps not at all."""
    from bench.timing import busy_us, idle_us

    assert busy_us([]) == 0
    assert busy_us([(0, 4), (10, 13)]) == 7  # one stream: the durations' sum
    assert busy_us([(10, 20), (0, 12), (15, 18), (30, 31), (30.5, 32)]) == 22  # overlaps, nesting, any order
    assert idle_us([]) == 0 and idle_us([(0, 4), (10, 13)]) == 6  # the gap between two kernels
    assert idle_us([(10, 20), (0, 12), (15, 18), (30, 31), (30.5, 32)]) == 10  # 20 -> 30 only: overlaps are busy


def test_idle_time_is_split_by_the_kernels_around_each_gap():
    """Each gap goes to (the kernel that ran last before it, the kernel after it); the parts sum to idle_us."""
    from bench.timing import idle_by_pair, idle_us

    kernels = [(10, 20, "b"), (0, 12, "a"), (15, 18, "c"), (30, 31, "d"), (30.5, 32, "e"), (35, 36, "d"), (40, 41, "e")]
    gaps = idle_by_pair(kernels)
    assert gaps == {("b", "d"): 10, ("e", "d"): 3, ("d", "e"): 4}  # c ends inside b: the gap follows b
    assert sum(gaps.values()) == idle_us([(start, end) for start, end, _ in kernels])
    assert idle_by_pair([]) == {} and idle_by_pair([(0, 1, "a"), (1, 2, "b")]) == {}


def test_step_profile_names_kernels_as_the_report_shows_them():
    from bench.bench_step import IDLE_PAIRS, OTHER_KERNELS, PROFILE_MIN_MS, step_profile

    conv = "conv_fwd_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_Si32_I4_B1_B0"  # a cuTile kernel, one specialization
    conv_seq_idx = "conv_fwd_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2i32_1v4l0_Si32_I4_B1_B1"  # another: with seq_idx
    small = PROFILE_MIN_MS / 4
    by_kernel = {
        "_chunk_scan_fwd_kernel": 3.0,
        conv: 2.0,
        conv_seq_idx: 1.5,
        "norm_bwd_kernel_Kt2_A2bf16_I1536_B1": 1.0,
    }
    by_kernel |= {"triton_poi_fused_1": small, "triton_poi_fused_2": small}
    # idle time before both conv specializations is one pair; only the IDLE_PAIRS largest pairs are kept
    idle = {("_chunk_scan_fwd_kernel", conv): 0.2, ("_chunk_scan_fwd_kernel", conv_seq_idx): 0.1}
    idle |= {(f"triton_poi_fused_{i}", "_chunk_scan_fwd_kernel"): 0.01 * (i + 1) for i in range(IDLE_PAIRS)}
    profiled = {"ms": 7.0, "idle_ms": 0.5, "kernels": 72, "by_kernel": by_kernel, "launches": {}, "idle_by_pair": idle}
    prof = step_profile(profiled)
    assert prof["gpu_ms"] == 7.0 and prof["idle_ms"] == 0.5 and prof["kernels"] == 72
    shown = [("conv_fwd", 3.5), ("_chunk_scan_fwd_kernel", 3.0), ("norm_bwd", 1.0), (OTHER_KERNELS, 2 * small)]
    assert list(prof["kernels_ms"].items()) == shown
    pairs = list(prof["idle_ms_by_pair"].items())
    assert len(pairs) == IDLE_PAIRS and pairs[0] == ("_chunk_scan_fwd_kernel -> conv_fwd", pytest.approx(0.3))
    assert pairs[1][0] == f"triton_poi_fused_{IDLE_PAIRS - 1} -> _chunk_scan_fwd_kernel"


def test_write_json_rounds_floats_to_seven_significant_digits(tmp_path):
    from bench.results import write_json

    payload = {"step_ms": 57.899301, "runs": [{"gpu_ms": 0.00012345678}, (1.0, 2)], "n": 20, "name": "x"}
    loaded = json.loads(write_json(tmp_path / "a" / "r.json", payload).read_text())
    assert loaded == {"step_ms": 57.8993, "runs": [{"gpu_ms": 0.0001234568}, [1.0, 2]], "n": 20, "name": "x"}
    assert isinstance(loaded["n"], int)
