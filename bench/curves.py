"""Training curves of train.py runs that differ in a few arguments, each run in its own process: its training loss
per logged step and its validation loss read back from its CSV log, its steady step from the step timer.

    python -m bench.curves --config configs/medium.yaml --steps 300 --out results/boundaries_medium_h200.json \
        --run boundaries=--data.document_boundaries=true --run packed=--data.document_boundaries=false \
        -- --model.config.ssd_backward=cutile --trainer.val_check_interval=100

A run is LABEL=ARG[,ARG...]: its own train.py arguments. Arguments after `--` go to every run. Runs go one after the
other on the same caches (the first compiles and builds the data; the others reuse them), each in WORK/<label>
(--work; default: a temporary folder). Writes JSON (bench.results.write_json) with the environment, rewritten after
each run (a process stopped part way keeps the runs it finished); BENCHMARKS.md renders it (python -m bench.report
--curves NAME).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

from bench.first_step import train
from bench.results import write_json
from lightning_modules.environment import environment


def parse_run(text: str) -> tuple[str, list[str]]:
    """'LABEL=ARG[,ARG...]' -> (label, [arg, ...]); ValueError when the label or the arguments are missing."""
    label, sep, args = text.partition("=")
    if not sep or not label or not args:
        raise ValueError(f"a run is LABEL=ARG[,ARG...], got {text!r}")
    return label, args.split(",")


def read_metrics(root: Path) -> dict[str, list[list[float]]]:
    """Every CSV log row under `root` (csv/version_*/metrics.csv) -> {"train_loss": [[step, loss], ...],
    "val_loss": [[step, loss], ...]}, in step order."""
    series: dict[str, list[list[float]]] = {"train_loss": [], "val_loss": []}
    for path in sorted(root.glob("csv/version_*/metrics.csv")):
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                for key, column in (("train_loss", "train/loss"), ("val_loss", "val/loss")):
                    if row.get(column):
                        series[key].append([int(row["step"]), float(row[column])])
    return {key: sorted(points) for key, points in series.items()}


def measure(label: str, run_args: list[str], common: list[str], work: Path, timeout: float) -> dict:
    """The record of one run: exit code, process seconds, the step timer's summary and the loss curves."""
    root = work / label
    code, wall = train([*common, *run_args, f"--trainer.default_root_dir={root}"], None, work / f"{label}.log", timeout)
    summary = root / "step_times.json"
    print(f"curves: {label}: exit {code} in {wall:.1f} s", flush=True)
    return {
        "label": label,
        "args": run_args,
        "exit_code": code,
        "process_s": wall,
        "steady": json.loads(summary.read_text()) if summary.exists() else {},
        **read_metrics(root),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(
        prog="python -m bench.curves", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default="configs/medium.yaml", help="train.py's --config")
    ap.add_argument("--run", action="append", required=True, help="LABEL=ARG[,ARG...]; repeat for each run")
    ap.add_argument("--steps", type=int, default=300, help="--trainer.max_steps of every run")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds each train.py run may take")
    ap.add_argument("--out", default="results/curves.json")
    ap.add_argument("--work", type=Path, help="keep each run's folder and log in WORK (default: removed)")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        runs = [parse_run(r) for r in args.run]
    except ValueError as e:
        ap.error(f"--run: {e}")
    if len({label for label, _ in runs}) < len(runs):
        ap.error("--run: labels must differ")
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    common = ["--config", args.config, f"--trainer.max_steps={args.steps}", *extra]
    common += ["--trainer.enable_progress_bar=false"]
    settings = {"config": args.config, "steps": args.steps, "train_args": extra}
    head = {"kind": "curves", "settings": settings, "environment": environment()}
    records: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="curves-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        for label, run_args in runs:  # the JSON holds every finished run: a process cut short keeps them
            records.append(measure(label, run_args, common, work, args.timeout))
            write_json(args.out, {**head, "records": records})
    print(f"curves: wrote {args.out}")
    return 0 if all(r["exit_code"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
