"""The headline: the speedups and scaling efficiencies measured in at least HEADLINE_RUNS processes, as a block
that BENCHMARKS.md shows and README.md carries between its headline markers."""

from __future__ import annotations

import math
import re
from pathlib import Path

from bench.report.format import cell, ordered, pct1, runs_text, table, times
from bench.report.kernels import MODE_NAMES, kernel_keys, shape_text, varying
from bench.report.series import HEADLINE_RUNS, Pool, devices, record_labels
from bench.report.step import STANDIN, model_text, series_keys, step_mode, step_runs

HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"


def headline(
    kpool: Pool,
    spool: Pool,
    krun: list[dict],
    sseries: list[list[dict]],
    base: str,
    gpu: str,
    scpool: Pool,
    scrun: list[dict],
) -> str:
    """Every other backend over the baseline at the largest kernel shape and at every step shape, and every
    backend's scaling efficiency, from the benchmarks measured in at least HEADLINE_RUNS processes; the others
    are named, not shown. `sseries`: the step series; `scrun` is empty when there is no scaling series."""
    step_keys = [k for k, by in spool.items() if step_runs(by, base) >= HEADLINE_RUNS]
    shown_labels = [
        *(record_labels(krun) if len(krun) >= HEADLINE_RUNS else []),
        *(n for k in step_keys for n in spool[k]),
    ]
    names = [n for n in ordered(shown_labels) if n not in (base, STANDIN)]
    rows = []
    if len(krun) >= HEADLINE_RUNS:
        largest = max((dict(k[1]) for k in kpool), key=lambda s: math.prod(v for v in s.values() if isinstance(v, int)))
        fields, _ = varying(dict(k[1]) for k in kpool)
        for key in kernel_keys(kpool):
            if dict(key[1]) == largest:
                shown = fields or [k for k in ("seqlen", "dstate", "chunk_size") if k in largest]
                what = f"SSD {MODE_NAMES.get(key[0], key[0])} alone, {shape_text(largest, shown)}"
                for clock, fig in (("wall clock", "wall_over_base"), ("GPU time", "gpu_over_base")):
                    cells = [cell(kpool[key].get(n, {}).get(fig), times) for n in names]
                    rows.append([f"{what}, {clock}", *cells, runs_text(krun)])
    for key in step_keys:
        (size, seqlen, batch, mode), by = key, spool[key]
        cells = [cell(by.get(n, {}).get("over_base"), times) for n in names]
        what = f"training step, {model_text(size, by)}, L {seqlen}, batch {batch}, {mode}"
        rows.append([what, *cells, f"{step_runs(by, base)} runs"])
    gpus = " / ".join(str(w) for w in ordered(k[4] for k in scpool))
    benchmarks = (
        ("the SSD alone", krun),
        *(
            (f"the training step ({', '.join(ordered(step_mode(r) for run in s for r in run['records']))})", s)
            for s in sseries
        ),
        (f"scaling to {gpus} GPUs", scrun),
    )
    missing = [
        f"Not in the headline, measured in {runs_text(runs)} ({HEADLINE_RUNS} needed): {what}, "
        f"{', '.join(r['file'].name for r in runs)}; "
        + ("its figures are in BENCHMARKS.md." if record_labels(runs) else "every record is an error.")
        for what, runs in benchmarks
        if runs and len(runs) < HEADLINE_RUNS
    ]
    missing += [
        f"Not in the headline: the training step, {model_text(k[0], by)}, L {k[1]}, batch {k[2]}, {k[3]}: "
        f"every backend over {base} in only {step_runs(by, base)} of its runs."
        for k, by in spool.items()
        if k not in step_keys and any(len(s) >= HEADLINE_RUNS and k in series_keys(s) for s in sseries)
    ]
    missing += [
        f"Not in the headline: {what}, {', '.join(r['file'].name for r in runs)}: every record is an error."
        for what, runs in benchmarks[1:-1]
        if len(runs) >= HEADLINE_RUNS and not record_labels(runs)
    ]
    parts = []
    if rows:
        header = [f"{gpu}: speedup over {base}", *names, "runs"]
        parts += [table(header, rows)]
    if len(scrun) >= HEADLINE_RUNS:
        scnames = record_labels(scrun)
        scrows = [
            [
                f"{size}, L {seqlen}, batch {batch} per GPU, {mode}",
                *(cell(by.get(n, {}).get("efficiency"), pct1) for n in scnames),
            ]
            + [runs_text(scrun)]
            for (size, seqlen, batch, mode, _), by in scpool.items()
        ]
        scgpu = devices(scrun)
        parts += [table([f"{scgpu}, {gpus} GPUs: scaling efficiency", *scnames, "runs"], scrows)]
    if parts:
        parts += ["Each cell: the median across runs, [min–max] when there are several."]
    return "\n\n".join(parts + (["\n".join(f"- {line}" for line in missing)] if missing else []))


def inject_headline(readme: Path, head: str) -> bool:
    """Replace what lies between README's headline markers with `head`; False (nothing written) when `readme` is
    absent or has no start marker."""
    if not readme.is_file() or HEADLINE_START not in readme.read_text():
        return False
    block = f"{HEADLINE_START}\n{head}\n{HEADLINE_END}"
    pattern = re.escape(HEADLINE_START) + ".*?" + re.escape(HEADLINE_END)
    readme.write_text(re.sub(pattern, lambda _: block, readme.read_text(), flags=re.S))
    return True
