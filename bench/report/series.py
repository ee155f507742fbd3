"""A benchmark's runs: loading its series of JSON files, checking they match, pooling their figures.

A series is DIR/NAME.json and DIR/NAME_run<N>.json, each written by one process with the same settings. A pooled
figure is the median across runs of each run's own figure (format.Stat).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.report.format import Stat, ordered, runs_text, setting
from bench.results import backward_records

HEADLINE_RUNS = 3  # a headline figure is the median of at least this many separate processes

# key -> backend label -> figure -> the figure across runs
Pool = dict[tuple, dict[str, dict[str, Stat | None]]]


def device_name(run: dict) -> str:
    """The GPU a run's JSON records, or "CPU" for a run made without one."""
    return run["environment"].get("gpu") or "CPU"


def devices(runs: Iterable[dict]) -> str:
    """The devices a series ran on, each once, in order: "NVIDIA H200", or "A / B" where runs differ."""
    return " / ".join(dict.fromkeys(device_name(r) for r in runs))


def env_value(run: dict, key: str) -> str:
    """One environment entry as text: the device's name for "gpu", "none" for a package the run lacked."""
    value = device_name(run) if key == "gpu" else run["environment"].get(key)
    return "none" if value is None else str(value)


def series_files(results: Path, name: str) -> list[Path]:
    """results/name.json and results/name_run<N>.json, in run order."""
    run_no = re.compile(re.escape(name) + r"(?:_run(\d+))?\.json")
    found = [(m, p) for p in results.glob(f"{name}*.json") if (m := run_no.fullmatch(p.name))]
    return [p for _, p in sorted(found, key=lambda mp: int(mp[0][1] or 0))]


FILES = ("out", "tuning_cache")  # settings that name a run's files: where it wrote, the tuning cache it used
FILE_ARGS = ("--data.cache_dir=", "--trainer.default_root_dir=")  # train.py arguments (train_args) that name files


def measured_args(args: list[str] | None) -> list[str]:
    """train.py arguments as they bear on what is measured: those naming where files go (FILE_ARGS) left out."""
    return [a for a in args or [] if not a.startswith(FILE_ARGS)]


def load_series(results: Path, name: str, kind: str) -> list[dict]:
    """The runs of one benchmark: results/name.json and results/name_run<N>.json, checked to match.

    Each run is its JSON with "file" added; a bench_kernels run gains its backward-alone records
    (bench.results.backward_records). Runs of one series must share settings (but FILES and FILE_ARGS) and GPU;
    the cuTile configurations each launched are in its "tuning".
    """
    found = series_files(results, name)
    if not found:
        raise SystemExit(f"bench.report: no {results / name}.json nor {name}_run<N>.json; run the benchmark first")
    runs = []
    for path in found:
        run = json.loads(path.read_text())
        if run.get("kind") != kind:
            raise SystemExit(f"bench.report: {path} has kind {run.get('kind')!r}, expected {kind!r}")
        if kind == "bench_kernels":
            run["records"] = run["records"] + backward_records(run["records"])
        runs.append({**run, "file": path})

    def measured(run: dict) -> dict:
        settings = {k: v for k, v in run["settings"].items() if k not in FILES}
        if "train_args" in settings:
            settings["train_args"] = measured_args(settings["train_args"])
        return {**settings, "gpu": device_name(run)}

    first = measured(runs[0])
    for run in runs[1:]:
        diff = sorted(k for k in first.keys() | measured(run).keys() if first.get(k) != measured(run).get(k))
        if diff:
            raise SystemExit(f"bench.report: {run['file']} differs from {runs[0]['file']} in {', '.join(diff)}")
    return runs


def label(rec: dict) -> str:
    """A record's backend as shown: its backend, and the backward it ran with when that is not its own."""
    backward = rec.get("backward")
    return rec["backend"] if backward in (None, "reference") else f"{rec['backend']} + {backward} backward"


def pool(
    runs: list[dict], key: Callable[[dict], tuple], figures: Callable[[dict, dict | None, dict], dict], base: str
) -> Pool:
    """key -> label -> figure -> Stat across runs. `figures(record, baseline record or None, run)` -> floats;
    the baseline is the record labelled `base` at the same key in the same run. Records with an error are skipped."""
    per_run: dict[tuple, dict[str, list[dict]]] = {}
    for run in runs:
        index: dict[tuple, dict[str, dict]] = {}
        for rec in run["records"]:
            if "error" not in rec:
                index.setdefault(key(rec), {})[label(rec)] = rec
        for k, by in index.items():
            for name, rec in by.items():
                per_run.setdefault(k, {}).setdefault(name, []).append(figures(rec, by.get(base), run))
    return {
        k: {
            name: {f: Stat.of(fs.get(f) for fs in figs) for f in ordered(f for fs in figs for f in fs)}
            for name, figs in by.items()
        }
        for k, by in per_run.items()
    }


def record_labels(runs: list[dict]) -> list[str]:
    """The backend labels of a series' records that did not fail, in the JSON's order."""
    return ordered(label(r) for run in runs for r in run["records"] if "error" not in r)


def captions(runs: list[dict]) -> list[str]:
    """Files, environment and settings of a series, each value once, or per run where runs differ."""
    env = {k: ordered(env_value(r, k) for r in runs) for r in runs for k in r["environment"]}
    settings = {k: v for k, v in runs[0]["settings"].items() if k not in ("out", "skipped")}
    skipped = runs[0]["settings"].get("skipped") or {}
    count = runs_text(runs).capitalize() + ", a single process" * (len(runs) == 1)
    count += f" (a headline needs {HEADLINE_RUNS})" if len(runs) < HEADLINE_RUNS else ""
    return [
        f"{count}: {', '.join(r['file'].name for r in runs)}.",
        "Environment: " + ", ".join(f"{k} {' / '.join(v)}" for k, v in env.items() if k != "host") + ".",
        "Settings: " + ", ".join(f"{k} {setting(v)}" for k, v in settings.items()) + ".",
        *([f"Skipped: {'; '.join(f'{k}: {v}' for k, v in skipped.items())}."] if skipped else []),
    ]
