"""The headline: bench/headline.sh report renders the series its parts write; README's block is replaced only
between its markers."""

from __future__ import annotations

import os
import subprocess

from bench.report.headline import inject_headline
from tests.bench.report.synthetic import CONFIG, ROOT, compiled_step_run, kernel_run, step_run, write
from tests.bench.report.test_boundaries_section import run as boundaries_run


def test_headline_script_renders_its_own_series(tmp_path):
    """bench/headline.sh report: the series its kernels, step, step_graphs, step_layers, step_l8192, sweep and
    boundaries parts write, three kernel processes pooled; no scaling run, none shown."""
    walls = [{"cutilereference": 0.5, "triton": t, "cutilecutile": 0.25} for t in (1.2, 1.0, 1.5)]
    write(tmp_path / "kernels_h200_headline.json", kernel_run(walls[0]))
    for i, w in enumerate(walls[1:], 2):
        write(tmp_path / f"kernels_h200_headline_run{i}.json", kernel_run(w))
    write(tmp_path / "step_h200_compiled.json", step_run())
    write(tmp_path / "step_h200_cudagraphs.json", compiled_step_run(70.0, "reduce-overhead"))
    layers = compiled_step_run(65.0, "reduce-overhead")
    layers["records"] = [{**r, "config": {**CONFIG, "conv_backend": "cutile"}} for r in layers["records"]]
    write(tmp_path / "step_h200_layers_graphs_quick.json", layers)
    write(tmp_path / "step_h200_l8192_layers_graphs_quick.json", layers)
    write(tmp_path / "kernels_h200_sweep.json", kernel_run(walls[0]))
    write(tmp_path / "step_h100_boundaries.json", boundaries_run(1.0))  # the boundaries part names the GPU
    (tmp_path / "README.md").write_text("<!-- headline:start -->\n<!-- headline:end -->\n")
    env = {**os.environ, "RESULTS": str(tmp_path), "OUT": str(tmp_path)}
    done = subprocess.run(["bash", "bench/headline.sh", "report"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ratios = sorted(w["triton"] / w["cutilereference"] for w in walls)
    head = (tmp_path / "README.md").read_text()
    assert f"{ratios[1]:.2f}x [{ratios[0]:.2f}x–{ratios[2]:.2f}x]" in head
    series = ("step_h200_compiled", "step_h200_cudagraphs", "step_h200_layers_graphs_quick")
    for name in (*series, "step_h200_l8192_layers_graphs_quick"):  # one run each
        assert f"{name}.json" in head
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## The SSD over the shape sweep" in text and "## Scaling" not in text
    assert "step_h200_compile_quick" not in text  # the series replaces the single run
    assert "## Document boundaries in the training step (bench/bench_step.py, step_h100_boundaries.json)" in text
    bad = subprocess.run(["bash", "bench/headline.sh", "kernels", "4"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "1, 2 or 3" in bad.stderr


def test_headline_block_is_written_only_into_a_readme_with_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    assert not inject_headline(readme, "new") and not readme.exists()
    readme.write_text("no markers\n")
    assert not inject_headline(readme, "new") and readme.read_text() == "no markers\n"
    readme.write_text("a\n<!-- headline:start -->\nold\n<!-- headline:end -->\nb\n")
    assert inject_headline(readme, "new \\1 block")  # the text is inserted as is, not as a regex template
    assert readme.read_text() == "a\n<!-- headline:start -->\nnew \\1 block\n<!-- headline:end -->\nb\n"


def fake_tools(bin_dir, log):
    """A `python` that records its arguments (one line per call) and an `nvidia-smi` naming an H200, first on PATH."""
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_long_parts_run_their_variants_with_the_output_before_the_train_arguments(tmp_path):
    """bench/headline.sh long and long_seed: bench.curves' --out lands before `--` (after it, train.py would get
    it), one process per N, the shape's batch and steps, checkpointing only when asked; long runs cuTile + cuTile
    backward and Triton, long_seed the seed's design alone into its own series; an unknown SEQ is refused."""
    log = tmp_path / "calls.txt"
    env = {**fake_tools(tmp_path / "bin", log), "RESULTS": str(tmp_path)}
    headline = ["bash", "bench/headline.sh", "long"]
    done = subprocess.run([*headline, "2"], cwd=ROOT, env={**env, "SEQ": "16384"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (call,) = log.read_text().splitlines()
    own, train = call.split(" -- ")
    assert own.startswith("-m bench.curves --config configs/long.yaml") and "--steps 200" in own
    assert own.endswith(f"--out {tmp_path}/long_16384_h200_run2.json")
    assert own.count("--run ") == 2 and "--run cutile=" in own and "--run triton=" in own
    assert train == "--data.seq_len=16384 --data.batch_size=4"
    log.unlink()
    seed = subprocess.run([*headline[:2], "long_seed", "1"], cwd=ROOT, env={**env, "SEQ": "65536"}, capture_output=True)
    assert seed.returncode == 0, seed.stderr
    (call,) = log.read_text().splitlines()
    assert call.endswith(f"--out {tmp_path}/long_65536_h200_seed.json -- --data.seq_len=65536 --data.batch_size=1")
    assert call.count("--run ") == 1 and "--run cutile_reference=" in call and "ssd_backward=reference" in call
    log.unlink()
    env = {**env, "SEQ": "131072", "CHECKPOINT": "1"}
    assert subprocess.run(headline, cwd=ROOT, env=env, capture_output=True).returncode == 0
    calls = log.read_text().splitlines()
    assert [c.split(" -- ")[0].rsplit(" ", 1)[1] for c in calls] == [
        f"{tmp_path}/long_131072_h200{suffix}.json" for suffix in ("", "_run2", "_run3")
    ]
    tail = "-- --data.seq_len=131072 --data.batch_size=1 --data.val_fraction=0.1 --model.config.checkpoint_layers=true"
    assert all(c.endswith(tail) for c in calls)
    bad = subprocess.run(headline, cwd=ROOT, env={**env, "SEQ": "4096"}, capture_output=True, text=True)
    assert bad.returncode == 2 and "SEQ must be" in bad.stderr
