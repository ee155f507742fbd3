"""The SSD alone, per kernel: each backend's profiled kernels, GPU ms per call, and a cuTile stage's memory floor.

The floor is bench/traffic.py's bytes for the stage at the record's shape and the kernel's own constants, at the
copy ceiling measured in the same process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from types import ModuleType

from bench.kernel_names import cutile_kernel, short_name
from bench.report.format import cell, ordered, pct, ratio, table
from bench.report.kernels import MODE_NAMES, kernel_keys, shape_key, shape_text, varying
from bench.report.series import label, pool

OTHER = "other kernels"  # the call's kernels' summed time less that of the kernels shown
SHOWN = 8  # a record's largest kernels shown on their own rows; the rest count as OTHER


def traffic() -> ModuleType:
    """bench.traffic, imported on first use: it loads torch, which only records with per-kernel times need."""
    from bench import traffic as module

    return module


def shown_names(names: Iterable[str]) -> dict[str, str]:
    """Full name -> the table's name in code font. A short name several kernels share gets what tells them apart:
    a cuTile stage the specialization constants its kernels differ in (Q: the chunk size), others a number."""
    by_short: dict[str, list[str]] = {}
    for name in names:
        by_short.setdefault(short_name(name), []).append(name)
    shown = {}
    for short, full in by_short.items():
        consts = [getattr(cutile_kernel(n), "constants", None) for n in full]
        differ = [k for k in consts[0] or {} if len({repr(c.get(k)) for c in consts if c is not None}) > 1]
        if len(full) > 1 and all(c is not None for c in consts) and differ:
            shown |= {n: f"`{short}` ({', '.join(f'{k} {c.get(k)}' for k in differ)})" for n, c in zip(full, consts)}
        else:
            shown |= {n: f"`{short}`" + (f" #{i}" if len(full) > 1 else "") for i, n in enumerate(full, 1)}
    return shown


def per_kernel_figures(rec: dict, base: dict | None, run: dict) -> dict[tuple[str, str], float | None]:
    """(kernel, figure) -> value for each of the SHOWN largest kernels of the record's top_kernels_ms: "ms" per call
    and, for a cuTile stage, "floor_MB", "floor_us" (at the run's copy ceiling) and "of_floor" (floor over measured);
    (OTHER, "ms") for the rest of the call's kernels."""
    listed_ms = rec.get("top_kernels_ms") or {}
    top = dict(sorted(listed_ms.items(), key=lambda kv: -kv[1])[:SHOWN])
    launches = rec.get("kernel_launches") or {}  # per call; a listed kernel absent from it launched once
    out: dict[tuple[str, str], float | None] = {}
    for name, ms in top.items():
        out[(name, "ms")] = ms
        found = cutile_kernel(name)
        if found and found.constants is not None:
            model = traffic()
            moved = model.stage_traffic(found.stage, model.SSDShape.of(rec["shape"]), found.constants).total
            moved *= launches.get(name, 1)
            floor_us = ratio(moved / 1e3, run.get("ceilings", {}).get("copy_GBps"))
            out |= {(name, "floor_MB"): moved / 1e6, (name, "floor_us"): floor_us}
            out[(name, "of_floor")] = ratio(floor_us, ms * 1e3)
    listed = round(sum(launches.get(name, 1) for name in top))  # launches per call of the kernels shown
    summed = rec.get("gpu_kernel_sum_ms", rec.get("gpu_ms"))  # older records: one stream, GPU time is the sum
    if top and (rec.get("kernels_per_call", 0) > listed or len(top) < len(listed_ms)) and summed is not None:
        out[(OTHER, "ms")] = max(0.0, summed - sum(top.values()))
    return out


def per_kernel_section(runs: list[dict]) -> str:
    """A table per pass and shape: each backend's kernels, GPU ms per call, and a cuTile stage's memory floor."""
    ppool = pool(runs, shape_key, per_kernel_figures, "")
    listed = Counter((shape_key(r), label(r)) for run in runs for r in run["records"] if r.get("top_kernels_ms"))
    fields, _ = varying(dict(k[1]) for k in ppool)
    header = ["backend", "kernel", "GPU ms", "floor MB", "floor µs", "of floor"]
    parts = []
    for key in kernel_keys(ppool):
        by = {name: f for name, f in ppool[key].items() if f}  # the backends with per-kernel times
        if not by:
            continue
        names = shown_names(ordered(n for f in by.values() for n, _ in f if n != OTHER))
        rows = []
        for backend, f in by.items():
            timed = [n for n in ordered(n for n, _ in f) if f.get((n, "ms"))]
            for n in sorted(timed, key=lambda n: (n == OTHER, -f[(n, "ms")].median)):
                ms, floor_mb, floor_us, of_floor = (
                    f.get((n, fig)) for fig in ("ms", "floor_MB", "floor_us", "of_floor")
                )
                some = f" (in {ms.n} of {listed[key, backend]} runs)" if ms.n < listed[key, backend] else ""
                model = "" if floor_mb is None else f"{floor_mb.median:,.1f}"  # the same in every run: one shape
                rows.append([backend, names.get(n, n) + some, cell(ms), model, cell(floor_us), cell(of_floor, pct)])
        shape = shape_text(dict(key[1]), fields)
        parts += [f"#### {MODE_NAMES.get(key[0], key[0])}" + (f", {shape}" if shape else ""), "", table(header, rows)]
        parts += [""]
    lines = [
        "### GPU time per kernel",
        "",
        f"GPU ms per call of the {SHOWN} largest kernels a record lists (`top_kernels_ms`: torch.profiler's largest "
        f"kernels of the call; *{OTHER}*: the call's kernels' summed time less theirs, where it launched more). cuTile kernels go by "
        "their stage (kernels/cutile/*STAGE*.py) and, where a stage ran in several specializations, the constants that "
        "differ (Q: the chunk size); others by their function and the functor or template argument they were "
        "built with (kernels whose names shorten alike summed in the JSON; #1, #2 where older JSON kept them "
        "apart). *floor MB*: the bytes the stage must move at the row's shape and its own chunk size, each tensor "
        "it reads read once and each it writes written once (bench/traffic.py); *floor µs*: those bytes at the copy ceiling measured in the same process; "
        "*of floor*: the floor over the measured time. A kernel launched more than once per call in one "
        "specialization shows once, its time summed, against the floor of all its launches (`kernel_launches`; "
        "JSON without it: one launch's floor).",
        "",
        *parts,
    ]
    return "\n".join(lines).rstrip() if parts else "No per-kernel GPU times in the JSON (`top_kernels_ms`)."
