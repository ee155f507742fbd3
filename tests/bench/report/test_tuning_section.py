"""BENCHMARKS.md's shipped-table section pairs process N with the shipped table and process N with a fresh search,
pools the pairs' ratios as median [min–max], names the kernels whose configuration the search chose differently,
refuses a run that does not hold exactly one measured record, and is absent when the series are."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report.tuning import differing_choices, load, pair_ratios, tuning_rows, tuning_section
from tests.bench.report.synthetic import report_beside_minimal_series, write
from tests.bench.report.test_boundaries_section import ENV

SETTINGS = {"configs": "medium", "backends": "cutile_bwd+conv+norm", "documents": "stdlib"}


def record(step_ms: float) -> dict:
    return {"size": "medium", "seqlen": 2048, "batch": 8, "variant": "cutile_bwd+conv+norm", "documents": "stdlib",
            "mode": "compile", "median": {"step_ms": step_ms}, "tokens_per_s": 16384 / step_ms * 1e3,
            "warmup_s": 212.4}  # fmt: skip


def run(step_ms: float) -> dict:
    return {"kind": "bench_step", "environment": ENV, "settings": SETTINGS, "records": [record(step_ms)]}


CHOSEN = {
    "bwd_dx|b8_seq_idx": {"config": {"chunks": 8}, "source": "shipped"},
    "norm_fwd|N16384": {"config": {"TILE_D": 512}, "source": "shipped"},
}
SEARCHED = {
    "bwd_dx|b8_seq_idx": {"config": {"chunks": 4}, "source": "search", "mean_us": 150.0},
    "norm_fwd|N16384": {"config": {"TILE_D": 512}, "source": "search", "mean_us": 79.0},
}


def write_comparison(results: Path, name: str = "tuning_t") -> None:
    for i, (shipped, fresh) in enumerate([(50.0, 49.0), (51.0, 50.0), (49.5, 50.5)], 1):
        suffix = "" if i == 1 else f"_run{i}"
        write(results / f"{name}_shipped{suffix}.json", run(shipped) | {"tuning": CHOSEN})
        write(results / f"{name}_fresh{suffix}.json", run(fresh))
    write(results / f"{name}_search.json", run(60.0) | {"tuning": SEARCHED})


def test_pairs_are_taken_within_each_pair_then_pooled(tmp_path):
    write_comparison(tmp_path)
    cmp = load(tmp_path, "tuning_t")
    assert [round(r, 4) for r in pair_ratios(cmp["shipped"], cmp["fresh"])] == [1.0204, 1.02, 0.9802]
    shipped, fresh = tuning_rows(cmp)
    assert shipped == ["shipped table", "3", "50.0 [49.5–51.0]", "328k [321k–331k]", "1.02x [0.98x–1.02x]"]
    assert fresh[:3] == ["fresh search", "3", "50.0 [49.0–50.5]"] and fresh[4] == ""


def test_section_names_the_kernels_the_search_chose_differently(tmp_path):
    write_comparison(tmp_path)
    cmp = load(tmp_path, "tuning_t")
    assert differing_choices(cmp["search"], cmp["shipped"][0]) == [
        "bwd_dx|b8_seq_idx: search {'chunks': 4}, shipped run {'chunks': 8} (shipped)"
    ]
    text = tuning_section(cmp)
    assert text.startswith("## The shipped cuTile table against a fresh search (medium L 2048 batch 8,")
    assert "searched 2 kernels in a warm-up of 212 s" in text and "launched for 1:" in text
    assert "3 runs with the shipped table, 3 runs with the configurations a search made" in text


def test_a_run_with_more_than_one_measured_record_is_refused(tmp_path):
    write_comparison(tmp_path)
    bad = run(50.0)
    bad["records"].append(record(51.0))
    write(tmp_path / "tuning_t_fresh_run2.json", bad)
    with pytest.raises(SystemExit, match="holds 2 measured records"):
        tuning_rows(load(tmp_path, "tuning_t"))


def test_report_renders_the_comparison_only_when_present(tmp_path):
    text, _ = report_beside_minimal_series(tmp_path, "--tuning", "tuning_t")
    assert "## The shipped cuTile table" not in text
    write_comparison(tmp_path)
    text, _ = report_beside_minimal_series(tmp_path, "--tuning", "tuning_t")
    assert text.count("## The shipped cuTile table against a fresh search") == 1
