"""Render the benchmark JSON into BENCHMARKS.md, PNG plots, reconciliation.json and README's headline.

    python -m bench.report                                   # results/*.json -> BENCHMARKS.md, README.md
    python -m bench.report --results DIR --out DIR --kernels NAME --step NAME[,NAME...] [--scaling NAME]
        [--first_step NAME] [--boundaries NAME[,NAME...]] [--curves NAME] [--long NAME[,NAME...]]
        [--tuning NAME[,NAME...]]

A benchmark is a series of runs, DIR/NAME.json and DIR/NAME_run<N>.json, each written by one process of
bench/bench_kernels.py, bench/bench_step.py or bench/bench_scaling.py with the same settings (the scaling series
is optional: without --scaling, scaling_h200x2 is rendered when DIR holds it). A figure is the median across
runs of each run's own figure, with [min–max] when there are several. "X over triton" is triton's time over X's
(above 1: X is faster), taken within each run, where the backends alternate, before pooling. The backward alone
(pass "bwd") is each run's forward + backward less its forward. The SSD alone is also shown per kernel, each
cuTile stage against its memory floor (bench/traffic.py).
Backends, shapes, modes and captions are read from the JSON; plots and reconciliation.json are written beside
it, BENCHMARKS.md into --out, and README.md's headline block there is refreshed when present.
Sections rendered only when their JSON is present: the first step (bench/first_step.py's NAME.json, --first_step),
document boundaries in the step (a bench/bench_step.py series over --documents, --boundaries), training curves
(bench/curves.py's NAME.json, --curves; its plot is written beside it as NAME.png), long context (series of
bench/curves.py on configs/long.yaml, --long) and the shipped cuTile table against a fresh search (--tuning).
The report states no conclusions: what the figures were taken to mean is in docs/ (beside BENCHMARKS.md), by
topic.

Amdahl: with s the SSD's share of the baseline's step and k the SSD speedup of X over the baseline, the
predicted step speedup is 1 / ((1 - s) + s / k).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.report.amdahl import reconcile, reconcile_section
from bench.report.boundaries import BOUNDARIES_DEFAULT, boundaries_section
from bench.report.curves import CURVES_DEFAULT, curves_plot, curves_section
from bench.report.first_step import FIRST_STEP_DEFAULT, first_step_section
from bench.report.format import ordered, runs_text
from bench.report.headline import headline, inject_headline
from bench.report.kernels import kernel_figures, kernel_section, shape_key, sweep_section
from bench.report.long_context import LONG_DEFAULT, long_section
from bench.report.per_kernel import per_kernel_section
from bench.report.plots import plots, scaling_plot
from bench.report.scaling import SCALING_DEFAULT, scaling_figures, scaling_key, scaling_section
from bench.report.series import devices, load_series, pool, series_files
from bench.report.step import claim_step_rows, step_figures, step_key, step_section
from bench.report.tuning import TUNING_DEFAULT, tuning_section
from bench.report.tuning import load as load_tuning
from bench.report.tuning import present as tuning_present
from bench.results import write_json

ROOT = Path(__file__).resolve().parents[2]


def relative(path: Path, start: Path) -> str:
    """`path` relative to `start` where it lies below it, else as given."""
    try:
        return str(path.resolve().relative_to(start.resolve()))
    except ValueError:
        return str(path)


def parser() -> argparse.ArgumentParser:
    """The options of `python -m bench.report`; this module's docstring is its --help."""
    ap = argparse.ArgumentParser(
        prog="python -m bench.report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--results", type=Path, default=ROOT / "results", help="the JSON; plots are written here")
    ap.add_argument("--out", type=Path, default=ROOT, help="BENCHMARKS.md goes here; README.md here is refreshed")
    ap.add_argument("--kernels", default="kernels_h200", help="series NAME: NAME.json and NAME_run<N>.json")
    ap.add_argument(
        "--step",
        default="step_h200",
        help="series NAME: NAME.json and NAME_run<N>.json; several, comma-separated (e.g. one per compile mode)",
    )
    ap.add_argument(
        "--scaling",
        default=None,
        help=f"series NAME of bench/bench_scaling.py; default: {SCALING_DEFAULT} when present, else none",
    )
    ap.add_argument("--sweep", default=None, help="series NAME of bench_kernels over the shape sweep (--shapes sweep)")
    ap.add_argument("--baseline", default="triton", help="the backend every ratio is taken over")
    ap.add_argument(
        "--first_step", default=FIRST_STEP_DEFAULT, help="bench/first_step.py's JSON NAME.json (rendered when present)"
    )
    ap.add_argument(
        "--boundaries",
        default=BOUNDARIES_DEFAULT,
        help="series NAME of bench/bench_step.py over --documents: NAME.json and NAME_run<N>.json (each rendered "
        "when present); several, comma-separated (e.g. one per GPU)",
    )
    ap.add_argument("--curves", default=CURVES_DEFAULT, help="bench/curves.py's JSON NAME.json (rendered when present)")
    ap.add_argument(
        "--long",
        default=LONG_DEFAULT,
        help="series NAME of bench/curves.py on configs/long.yaml: NAME.json and NAME_run<N>.json; several, "
        "comma-separated (one per GPU and sequence length): one section, the rows of each series present",
    )
    ap.add_argument(
        "--tuning",
        default=TUNING_DEFAULT,
        help="NAME of bench/headline.sh tuning's comparison: series NAME_shipped and NAME_fresh, NAME_search.json "
        "(rendered when present); several, comma-separated (e.g. one per GPU)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """Render the series the options name; print what was written."""
    args = parser().parse_args(argv)

    krun = load_series(args.results, args.kernels, "bench_kernels")
    named = {
        name: load_series(args.results, name, "bench_step") for name in ordered(n.strip() for n in args.step.split(","))
    }
    named, left_out = claim_step_rows(named)
    sseries = list(named.values())
    srun = [r for runs in sseries for r in runs]
    scaling = args.scaling or (SCALING_DEFAULT if series_files(args.results, SCALING_DEFAULT) else None)
    scrun = load_series(args.results, scaling, "bench_scaling") if scaling else []
    swrun = load_series(args.results, args.sweep, "bench_kernels") if args.sweep else []
    base = args.baseline
    kpool = pool(krun, shape_key, kernel_figures, base)
    spool = pool(srun, step_key, step_figures, base)
    scpool = pool(scrun, scaling_key, scaling_figures, base)
    rec = reconcile(srun, spool, kpool, base)
    gpu = devices([*krun, *srun])
    pngs = plots(kpool, spool, rec, base, gpu, args.results)
    if scpool:
        scgpu = devices(scrun)
        pngs.append(scaling_plot(scpool, scgpu, runs_text(scrun), args.results))
    write_json(args.results / "reconciliation.json", rec)

    out = args.out / "BENCHMARKS.md"
    first = args.results / f"{args.first_step}.json"
    bnames = ordered(n.strip() for n in args.boundaries.split(","))
    bruns = [load_series(args.results, n, "bench_step") for n in bnames if series_files(args.results, n)]
    lnames = ordered(n.strip() for n in args.long.split(","))
    lruns = {n: load_series(args.results, n, "curves") for n in lnames if series_files(args.results, n)}
    tnames = ordered(n.strip() for n in args.tuning.split(","))
    truns = [load_tuning(args.results, n) for n in tnames if tuning_present(args.results, n)]
    curves = args.results / f"{args.curves}.json"
    cdata = json.loads(curves.read_text()) if curves.is_file() else None
    cpngs = [curves_plot(cdata, curves.with_suffix(".png"))] if cdata else []  # the section links it
    sources = ", ".join(f"{relative(r['file'], args.out)}" for r in [*krun, *swrun, *srun, *scrun])
    docs = args.out / "docs" / "README.md"  # docs/ beside BENCHMARKS.md: what the figures were taken to mean
    head = headline(kpool, spool, krun, sseries, base, gpu, scpool, scrun)
    command = f"python -m bench.report --kernels {args.kernels} --step {args.step}"
    command += (f" --scaling {scaling}" if scaling else "") + (f" --sweep {args.sweep}" if args.sweep else "")
    command += f" --baseline {base}" if base != "triton" else ""
    parts = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` from {sources}; do not edit by hand."
        + (" What these figures were taken to mean is in [docs/](docs/README.md), by topic." if docs.is_file() else ""),
        "",
        head,
        "",
        *[f"![{p.stem}]({relative(p, args.out)})" for p in pngs],
        "",
        kernel_section(krun, kpool, base),
        "",
        per_kernel_section(krun),
        "",
        *([sweep_section(swrun, pool(swrun, shape_key, kernel_figures, base), base), ""] if swrun else []),
        step_section(sseries, spool, base, left_out),
        "",
        reconcile_section(rec, base, kpool),
        *(["", scaling_section(scrun, scpool)] if scrun else []),
        *(["", first_step_section(json.loads(first.read_text()), first)] if first.is_file() else []),
        *(part for runs in bruns for part in ("", boundaries_section(runs))),
        *(part for cmp in truns for part in ("", tuning_section(cmp))),
        *(["", curves_section(cdata, curves, relative(cpngs[0], args.out))] if cdata else []),
        *(["", long_section(lruns)] if lruns else []),
    ]
    out.write_text("\n".join(parts) + "\n")
    written = [out, *pngs, *cpngs, args.results / "reconciliation.json"]
    readme = args.out / "README.md"
    if inject_headline(readme, head):
        written.append(readme)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
