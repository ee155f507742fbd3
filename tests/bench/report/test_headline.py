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
