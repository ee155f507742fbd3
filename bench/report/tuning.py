"""The shipped cuTile table against a fresh search (bench/headline.sh tuning): the same bench_step process run with
kernels/cutile/tuned.json and with the configurations a search made afresh (the table ignored), processes
alternating in pairs; each pair's step with the table over its step with the search, pooled as median [min–max],
and the kernels for which the search chose another configuration than the table holds."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report.boundaries import environment_text
from bench.report.format import Stat, cell, ratio, runs_text, table, times
from bench.report.series import load_series, series_files

TUNING_DEFAULT = "tuning_h200,tuning_h100"  # --tuning's NAME: NAME_shipped, NAME_fresh (series) and NAME_search.json
SHIPPED, FRESH, SEARCH = "_shipped", "_fresh", "_search"


def present(results: Path, name: str) -> bool:
    """Whether both series of the comparison NAME are in `results`."""
    return all(series_files(results, name + part) for part in (SHIPPED, FRESH))


def load(results: Path, name: str) -> dict:
    """The comparison NAME: its two series of bench_step runs and the search's run (None where absent)."""
    search = results / f"{name}{SEARCH}.json"
    return {
        "shipped": load_series(results, name + SHIPPED, "bench_step"),
        "fresh": load_series(results, name + FRESH, "bench_step"),
        "search": {**json.loads(search.read_text()), "file": search} if search.is_file() else None,
    }


def measured(run: dict) -> dict:
    """A run's one measured record (each process of the comparison times one variant at one documents kind)."""
    done = [rec for rec in run["records"] if "error" not in rec]
    if len(done) != 1:
        raise SystemExit(f"bench.report: {run['file']} holds {len(done)} measured records, the comparison needs 1")
    return done[0]


def pair_ratios(shipped: list[dict], fresh: list[dict]) -> list[float | None]:
    """Each process pair's step with the shipped table over its step with the search (run N with run N)."""
    return [ratio(measured(s)["median"]["step_ms"], measured(f)["median"]["step_ms"]) for s, f in zip(shipped, fresh)]


def differing_choices(search: dict, shipped: dict) -> list[str]:
    """The kernels (kernel|shape key) whose configuration the search chose differently from the one the shipped
    run launched, as "kernel|key: search {...}, shipped {...} (source)"."""
    lines = []
    for key, found in (search.get("tuning") or {}).items():
        used = (shipped.get("tuning") or {}).get(key)
        if used is not None and used["config"] != found["config"]:
            lines.append(f"{key}: search {found['config']}, shipped run {used['config']} ({used['source']})")
    return lines


def tuning_rows(cmp: dict) -> list[list[str]]:
    """One row per table: processes, step ms, tokens/s, and its step over the fresh search's within each pair."""
    ratios = Stat.of(pair_ratios(cmp["shipped"], cmp["fresh"]))
    rows = []
    for what, runs, over in (("shipped table", cmp["shipped"], ratios), ("fresh search", cmp["fresh"], None)):
        recs = [measured(run) for run in runs]
        rows.append(
            [
                what,
                str(len(runs)),
                cell(Stat.of(rec["median"]["step_ms"] for rec in recs)),
                cell(Stat.of(rec["tokens_per_s"] for rec in recs), lambda v: f"{v / 1e3:.0f}k"),
                cell(over, times),
            ]
        )
    return rows


def tuning_section(cmp: dict) -> str:
    """The section for one comparison (load's dict)."""
    shipped, fresh, search = cmp["shipped"], cmp["fresh"], cmp["search"]
    rec = measured(shipped[0])
    files = ", ".join(run["file"].name for run in [*shipped, *fresh])
    what = f"{rec['size']} L {rec['seqlen']} batch {rec['batch']}, {rec['variant']}, documents {rec['documents']}"
    lines = [
        f"## The shipped cuTile table against a fresh search ({what})",
        "",
        f"`bash bench/headline.sh tuning`: {runs_text(shipped)} with the shipped table, {runs_text(fresh)} with the "
        f"configurations a search made with the table ignored, in pairs run one after the other ({files}); "
        f"{environment_text(run['environment'] for run in [*shipped, *fresh])}. *step over the fresh search's*: "
        "within each pair, above 1 where the search's configurations are faster.",
        "",
        table(["table", "processes", "step (ms)", "tokens/s", "step over the fresh search's"], tuning_rows(cmp)),
    ]
    if search is not None:
        searched = sum(1 for v in (search.get("tuning") or {}).values() if v.get("source") == "search")
        record = measured(search)
        differ = differing_choices(search, shipped[0])
        lines += [
            "",
            f"The search ({search['file'].name}) searched {searched} kernels in a warm-up of "
            f"{record['warmup_s']:.0f} s; it chose another configuration than the shipped run launched for "
            f"{len(differ)}" + (":" if differ else "."),
            *(f"- {line}" for line in differ),
        ]
    return "\n".join(lines)
