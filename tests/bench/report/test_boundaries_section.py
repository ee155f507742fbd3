"""BENCHMARKS.md's boundaries section renders a bench_step series over packed documents: per run, each variant's
cost of boundaries and triton's step over cuTile's, pooled across runs; failed rows listed under the table."""

from __future__ import annotations

import statistics

from bench.kernel_names import KINDS
from bench.report import boundaries
from bench.report.boundaries import (
    ALL_KERNELS,
    IDLE,
    boundaries_pool,
    boundaries_section,
    is_cutile,
    kernel_pool,
    kernel_rows,
    kind_ms,
    triton_twin,
)
from bench.report.series import load_series
from tests.bench.report.synthetic import report_beside_minimal_series, write

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
CUTILE = "cutile_bwd+conv+norm"
TRITON = "triton+conv+norm"  # the same layers around the SSD: the row CUTILE is taken over


def record(variant: str, documents: str, step_ms: float) -> dict:
    """A bench_step record of the medium model at L 2048, compiled."""
    rec = {"size": "medium", "seqlen": 2048, "batch": 8, "mode": "compile", "compile_mode": "default"}
    return rec | {"variant": variant, "documents": documents, "median": {"step_ms": step_ms}, "tokens_per_s": 1e6}


def run(scale: float, failed: bool = False) -> dict:
    """One process: triton and cuTile at every documents setting; cuTile's "short" row failed where `failed`."""
    steps = {(TRITON, "none"): 100.0, (TRITON, "stdlib"): 104.0, (TRITON, "short"): 110.0}
    steps |= {(CUTILE, "none"): 80.0, (CUTILE, "stdlib"): 82.0, (CUTILE, "short"): 88.0}
    records = [record(v, d, ms * (scale if v == CUTILE else 1.0)) for (v, d), ms in steps.items()]
    if failed:
        records = [r for r in records if (r["variant"], r["documents"]) != (CUTILE, "short")]
        records.append({"size": "medium", "seqlen": 2048, "mode": "compile", "variant": CUTILE, "error": "OOM"})
    settings = {"out": "x", "documents": "none,short,stdlib"}
    return {"kind": "bench_step", "environment": ENV, "settings": settings, "records": records}


def test_figures_are_taken_within_each_run_then_pooled(tmp_path):
    scales = (1.0, 0.9, 1.1)
    for i, scale in enumerate(scales, 1):
        write(tmp_path / f"b{'' if i == 1 else f'_run{i}'}.json", run(scale))
    runs = load_series(tmp_path, "b", "bench_step")
    (by,) = boundaries_pool(runs).values()
    assert [row for row in by] == [(d, v) for d in ("none", "stdlib", "short") for v in (TRITON, CUTILE)]
    over = by[("short", CUTILE)]["over_triton"]
    assert over.n == 3 and over.median == 110.0 / 88.0 and over.min == 110.0 / (88.0 * 1.1)
    cost = by[("stdlib", TRITON)]["cost"]
    assert cost.n == 3 and cost.median == cost.min == cost.max == 1.04
    assert by[("none", CUTILE)]["cost"] is None and by[("none", TRITON)]["over_triton"] is None
    assert by[("stdlib", CUTILE)]["step_ms"].median == statistics.median(82.0 * s for s in scales)


def test_section_is_a_table_of_rows_with_a_caption_and_failures_below(tmp_path):
    write(tmp_path / "b.json", run(1.0))
    write(tmp_path / "b_run2.json", run(0.9, failed=True))
    text = boundaries_section(load_series(tmp_path, "b", "bench_step"))
    assert "`python -m bench.bench_step --documents none,short,stdlib`" in text  # the command its settings give
    assert "b.json, b_run2.json" in text and "2 runs" in text and "medium, L 2048, batch 8, compile default" in text
    assert "--documents none,short,stdlib" in text and "NVIDIA H200, driver 580" in text and "2026-12-04" in text
    tokens = "1,000,000 [1,000,000–1,000,000]"
    assert f"| none | {TRITON} | 100.00 [100.00–100.00] | {tokens} | – | – |" in text
    assert f"| none | {CUTILE} | 76.00 [72.00–80.00] | {tokens} | – | 1.32x [1.25x–1.39x] |" in text
    assert f"| stdlib | {TRITON} | 104.00 [104.00–104.00] | {tokens} | +4.0% [+4.0%–+4.0%] | – |" in text
    assert f"| short | {CUTILE} | 88.00 | 1,000,000 | +10.0% | 1.25x |" in text  # from the one run that measured it
    assert text.splitlines()[-1] == f"- Failed, b_run2.json: medium L 2048 compile {CUTILE}: OOM"


def test_only_cutile_variants_are_taken_over_triton_with_the_same_layers(tmp_path):
    assert is_cutile(CUTILE) and is_cutile("cutile")
    assert not any(is_cutile(v) for v in ("triton", "triton+conv+norm", "torch", "standin+conv+norm"))
    assert triton_twin(CUTILE) == TRITON and triton_twin("cutile") == "triton"
    plain = run(1.0)  # triton with the compiled PyTorch conv and norm: not CUTILE's twin
    plain["records"] = [r | {"variant": "triton"} if r["variant"] == TRITON else r for r in plain["records"]]
    write(tmp_path / "p.json", plain)
    (by,) = boundaries_pool(load_series(tmp_path, "p", "bench_step")).values()
    assert all(by[(d, CUTILE)]["over_triton"] is None for d in ("none", "stdlib", "short"))


def test_report_renders_the_section_when_the_series_is_present(tmp_path):
    text, _ = report_beside_minimal_series(tmp_path, "--boundaries", "b")
    assert "## Document boundaries" not in text
    write(tmp_path / "b_run2.json", run(1.0))
    text, _ = report_beside_minimal_series(tmp_path, "--boundaries", "b")
    assert "## Document boundaries in the training step (bench/bench_step.py, b_run2.json)" in text
    assert f"| short | {CUTILE} | 88.00 | 1,000,000 | +10.0% | 1.25x |" in text


def profiled(scale: float) -> dict:
    """run(scale) with a profile on cuTile's none and stdlib rows: a conv, a GEMM, and in the stdlib row a kernel the
    none row lacks; the GPU idles 1 ms a step in the none row, 1.5 in the stdlib row."""
    out = run(scale)
    for rec in out["records"]:
        if (rec["variant"], rec["documents"]) == (CUTILE, "none"):
            rec["profile"] = {"kernels_ms": {"conv_fwd": 2.0 * scale, "nvjet_gemm": 10.0}, "idle_ms": 1.0}
        if (rec["variant"], rec["documents"]) == (CUTILE, "stdlib"):
            kernels = {"conv_fwd": 0.5 + 2.0 * scale, "nvjet_gemm": 10.0, "elementwise_kernel": 0.25}
            rec["profile"] = {"kernels_ms": kernels, "idle_ms": 1.5}
    return out


def test_kernel_table_shows_each_kernels_change_with_boundaries_within_each_run(tmp_path):
    for i, scale in enumerate((1.0, 2.0, 3.0), 1):
        write(tmp_path / f"k{'' if i == 1 else f'_run{i}'}.json", profiled(scale))
    runs = load_series(tmp_path, "k", "bench_step")
    (by,) = kernel_pool(runs).values()
    assert list(by) == [("none", CUTILE), ("stdlib", CUTILE)]  # rows without a profile are left out
    ms, change = by[("stdlib", CUTILE)]["conv_fwd"]
    assert (ms.median, ms.min, ms.max) == (4.5, 2.5, 6.5) and change.median == change.min == change.max == 0.5
    assert by[("stdlib", CUTILE)]["elementwise_kernel"][1].median == 0.25  # absent from the none row: 0 ms there
    assert by[("stdlib", CUTILE)][ALL_KERNELS][1].median == 0.75 and by[("none", CUTILE)]["conv_fwd"][1] is None
    header, rows = kernel_rows(by)
    assert header == ["kernel", f"{CUTILE} none", f"{CUTILE} stdlib"]
    assert rows == [
        ["`conv_fwd`", "4.00", "4.50 (+0.50)"],
        ["`elementwise_kernel`", "", "0.25 (+0.25)"],
        ["`nvjet_gemm`", "10.00", "10.00 (+0.00)"],
        [ALL_KERNELS, "14.00", "14.75 (+0.75)"],
        [IDLE, "1.00", "1.50 (+0.50)"],  # not a kernel: summed into none, never among the top
    ]
    text = boundaries_section(runs)
    assert "Where the time goes" in text and f"| {ALL_KERNELS} | 14.00 | 14.75 (+0.75) |" in text
    write(tmp_path / "plain.json", run(1.0))  # bench_step without --profile: no kernel table
    assert "Where the time goes" not in boundaries_section(load_series(tmp_path, "plain", "bench_step"))


def test_kernel_table_keeps_the_kernels_that_change_most(monkeypatch, tmp_path):
    write(tmp_path / "k.json", profiled(1.0))
    (by,) = kernel_pool(load_series(tmp_path, "k", "bench_step")).values()
    monkeypatch.setattr(boundaries, "TOP_KERNELS", 1)
    assert [row[0] for row in kernel_rows(by)[1]] == ["`conv_fwd`", ALL_KERNELS, IDLE]


def test_kind_table_sums_each_kind_of_kernel_within_each_run(tmp_path):
    """The profiled rows again, by kind: a kind a row lacks shows 0 ms, the sums and idle time as in the kernel
    table, and the section shows both tables."""
    for i, scale in enumerate((1.0, 2.0, 3.0), 1):
        write(tmp_path / f"k{'' if i == 1 else f'_run{i}'}.json", profiled(scale))
    runs = load_series(tmp_path, "k", "bench_step")
    (by,) = kernel_pool(runs, kind_ms).values()
    header, rows = kernel_rows(by, list(KINDS), "kind")
    assert header == ["kind", f"{CUTILE} none", f"{CUTILE} stdlib"]
    nothing = ["0.00", "0.00 (+0.00)"]
    assert rows == [
        ["matmuls", "10.00", "10.00 (+0.00)"],
        ["SSD", *nothing],
        ["conv + norm", "4.00", "4.50 (+0.50)"],
        ["compiled by Inductor", *nothing],
        ["optimizer", *nothing],
        ["other", "0.00", "0.25 (+0.25)"],
        [ALL_KERNELS, "14.00", "14.75 (+0.75)"],
        [IDLE, "1.00", "1.50 (+0.50)"],
    ]
    text = boundaries_section(runs)
    assert "by kind of kernel" in text and "| conv + norm | 4.00 | 4.50 (+0.50) |" in text
