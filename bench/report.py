"""Render the benchmark JSON into BENCHMARKS.md, PNG plots, reconciliation.json and README's headline.

    python -m bench.report                                   # results/*.json -> BENCHMARKS.md, README.md
    python -m bench.report --results DIR --out DIR --kernels NAME --step NAME[,NAME...] [--scaling NAME]

A benchmark is a series of runs, DIR/NAME.json and DIR/NAME_run<N>.json, each written by one process of
bench/bench_kernels.py, bench/bench_step.py or bench/bench_scaling.py with the same settings (the
scaling series is optional: without --scaling, scaling_h200x2 is rendered when DIR holds it). A figure is
the median across runs of each run's own figure, with [min–max] when there are several. "X over triton" is triton's time
over X's (above 1: X is faster), taken within each run, where the backends alternate, before pooling. The
backward alone (pass "bwd") is each run's forward + backward less its forward. The SSD alone is also shown per
kernel, each cuTile stage against its memory floor (bench/traffic.py).
Backends, shapes, modes and captions are read from the JSON; plots and reconciliation.json are written
beside it, BENCHMARKS.md into --out, and README.md's headline block there is refreshed when present.
This script states no conclusions: they live in results/notes.md, dated, naming the files they rest on.

Amdahl: with s the SSD's share of the baseline's step and k the SSD speedup of X over the baseline, the
predicted step speedup is 1 / ((1 - s) + s / k).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.kernel_names import cutile_kernel, short_name
from bench.results import STEP_LAYERS, backward_records

ROOT = Path(__file__).resolve().parent.parent
HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"
MODE_NAMES = {"fwd": "forward", "fwd_bwd": "forward + backward", "bwd": "backward (forward + backward less forward)"}
SHAPE_NAMES = {
    "seqlen": "L",
    "dstate": "n",
    "nheads": "heads",
    "headdim": "head dim",
    "ngroups": "groups",
    "chunk_size": "chunk",
}
# Kernel shape field -> step record config field describing the same SSD problem dimension.
SHAPE_IN_CONFIG = {"dstate": "d_state", "headdim": "headdim", "chunk_size": "chunk_size", "ngroups": "ngroups"}
HEADLINE_RUNS = 3  # a headline figure is the median of at least this many separate processes
STANDIN = "standin"  # bench_step's row with the SSD replaced by y = x·D: the rest of the step, not a backend
BACKEND_KEYS = ("ssd_backend", "ssd_backward")  # model config fields a record's backend label already gives
GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that replay CUDA graphs: no launch overhead
PEAK = "peak_bf16_tflops"  # the dense bf16 peak MFU is taken over, where the step JSON records it
STEP_COLUMNS = {  # record["median"] field -> column
    "step_ms": "step ms",
    "forward_ms": "fwd",
    "backward_ms": "bwd",
    "optimizer_ms": "opt",
    "ssd_forward_ms": "SSD fwd",
    "ssd_backward_ms": "SSD bwd",
    "peak_gib": "peak GiB",
    "reserved_gib": "reserved GiB",
}


@dataclass(frozen=True)
class Stat:
    """One figure across runs."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat | None:
        """The median, min and max of the finite values; None when there are none."""
        vs = [float(v) for v in values if v is not None and math.isfinite(v)]
        return cls(statistics.median(vs), min(vs), max(vs), len(vs)) if vs else None

    def cell(self, fmt: Callable[[float], str]) -> str:
        return fmt(self.median) if self.n == 1 else f"{fmt(self.median)} [{fmt(self.min)}–{fmt(self.max)}]"


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


def num(v: float) -> str:
    return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"


def pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def pct1(v: float) -> str:
    return f"{100 * v:.1f}%"


def times(v: float) -> str:
    return f"{v:.2f}x"


def cell(stat: Stat | None, fmt: Callable[[float], str] = num) -> str:
    return "" if stat is None else stat.cell(fmt)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing, zero or not finite."""
    ok = a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0
    return a / b if ok else None


def amdahl(share: float, speedup: float) -> float:
    """Whole-step speedup when a part taking `share` of the time gets `speedup` faster."""
    return 1.0 / ((1.0 - share) + share / speedup)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def label(rec: dict) -> str:
    """A record's backend as shown: its backend, and the backward it ran with when that is not its own."""
    backward = rec.get("backward")
    return rec["backend"] if backward in (None, "reference") else f"{rec['backend']} + {backward} backward"


def ordered(values: Iterable) -> list:
    return list(dict.fromkeys(values))


# ---- loading --------------------------------------------------------------------------------------------


def series_files(results: Path, name: str) -> list[Path]:
    """results/name.json and results/name_run<N>.json, in run order."""
    run_no = re.compile(re.escape(name) + r"(?:_run(\d+))?\.json")
    found = [(m, p) for p in results.glob(f"{name}*.json") if (m := run_no.fullmatch(p.name))]
    return [p for _, p in sorted(found, key=lambda mp: int(mp[0][1] or 0))]


def load_series(results: Path, name: str, kind: str) -> list[dict]:
    """The runs of one benchmark: results/name.json and results/name_run<N>.json, checked to match.

    Each run is its JSON with "file" added. Runs of one series must share settings (but "out") and GPU.
    """
    found = series_files(results, name)
    if not found:
        raise SystemExit(f"report.py: no {results / name}.json nor {name}_run<N>.json; run the benchmark first")
    runs = []
    for path in found:
        run = json.loads(path.read_text())
        if run.get("kind") != kind:
            raise SystemExit(f"report.py: {path} has kind {run.get('kind')!r}, expected {kind!r}")
        if kind == "bench_kernels":
            run["records"] = run["records"] + backward_records(run["records"])
        runs.append({**run, "file": path})

    def measured(run: dict) -> dict:
        return {**{k: v for k, v in run["settings"].items() if k != "out"}, "gpu": device_name(run)}

    first = measured(runs[0])
    for run in runs[1:]:
        diff = sorted(k for k in first.keys() | measured(run).keys() if first.get(k) != measured(run).get(k))
        if diff:
            raise SystemExit(f"report.py: {run['file']} differs from {runs[0]['file']} in {', '.join(diff)}")
    return runs


Pool = dict[tuple, dict[str, dict[str, Stat | None]]]


def pool(runs: list[dict], key: Callable[[dict], tuple], figures: Callable[[dict, dict | None, dict], dict], base: str):
    """key -> label -> figure -> Stat across runs. `figures(record, baseline record or None, run)` -> floats."""
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
    return ordered(label(r) for run in runs for r in run["records"] if "error" not in r)


# ---- the SSD alone --------------------------------------------------------------------------------------


def shape_key(rec: dict) -> tuple:
    return (rec["mode"], tuple(rec["shape"].items()))


def kernel_figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
    wall, gpu = rec["wall_ms"]["median"], rec.get("gpu_ms")
    other = base is not None and base is not rec
    return {
        "wall_ms": wall,
        "gpu_ms": gpu,
        "wall_over_base": ratio(base["wall_ms"]["median"], wall) if other else None,
        "gpu_over_base": ratio(base.get("gpu_ms"), gpu) if other else None,
        "GBps": rec.get("GBps_gpu") if rec["mode"] == "fwd" else None,
        "copy_share": ratio(rec.get("GBps_gpu"), run.get("ceilings", {}).get("copy_GBps"))
        if rec["mode"] == "fwd"
        else None,
        "launches": rec.get("kernels_per_call"),
        "warmup_s": rec.get("warmup_s"),
    }


def varying(shapes: Iterable[dict]) -> tuple[list[str], dict]:
    """(fields whose value differs between shapes, {field: value} of those that do not)."""
    shapes = list(shapes)
    values = {k: {repr(s.get(k)): s.get(k) for s in shapes} for k in ordered(k for s in shapes for k in s)}
    return [k for k, v in values.items() if len(v) > 1], {
        k: next(iter(v.values())) for k, v in values.items() if len(v) == 1
    }


def shape_text(shape: dict, fields: Iterable[str]) -> str:
    return ", ".join(f"{SHAPE_NAMES.get(k, k)} {shape[k]}" if k != "dtype" else str(shape[k]) for k in fields)


def kernel_keys(kpool: Pool) -> list[tuple]:
    """Pass first (in the JSON's order), then shape."""
    modes = ordered(k[0] for k in kpool)
    return sorted(kpool, key=lambda k: (modes.index(k[0]), [v for _, v in k[1]]))


def ceilings_text(runs: list[dict]) -> str:
    copy = Stat.of(r.get("ceilings", {}).get("copy_GBps") for r in runs)
    mm = Stat.of(r.get("ceilings", {}).get("bf16_matmul_TFLOPs") for r in runs)
    if not copy and not mm:
        return "No ceilings measured (no GPU)."
    return (
        f"Ceilings measured in the same process: device copy {cell(copy, '{:,.0f}'.format)} GB/s (read + write), "
        f"bf16 matmul {cell(mm, '{:,.0f}'.format)} TFLOP/s."
    )


def kernel_section(
    runs: list[dict],
    kpool: Pool,
    base: str,
    title: str = "The SSD alone (bench/bench_kernels.py)",
    lead: Iterable[str] = (),
) -> str:
    """The kernel table of a bench_kernels series under `title`, with the `lead` paragraphs before its captions."""
    fields, fixed = varying(dict(k[1]) for k in kpool)
    header = ["pass", *(SHAPE_NAMES.get(f, f) for f in fields), "backend", "wall ms", "GPU ms"]
    header += [f"wall: over {base}", f"GPU: over {base}", "GB/s (of copy ceiling)", "launches", "warm-up s"]
    rows = []
    for key in kernel_keys(kpool):
        shape = dict(key[1])
        for name, f in kpool[key].items():
            gbps = cell(f["GBps"], "{:,.0f}".format)
            share = f" ({cell(f['copy_share'], pct)})" if gbps and f["copy_share"] else ""
            rows.append(
                [key[0], *(str(shape[k]) for k in fields), name, cell(f["wall_ms"]), cell(f["gpu_ms"])]
                + [cell(f["wall_over_base"]), cell(f["gpu_over_base"]), gbps + share]
                + [cell(f["launches"], "{:.0f}".format), cell(f["warmup_s"])]
            )
    return "\n".join(
        [
            f"## {title}",
            "",
            *(line for paragraph in lead for line in (paragraph, "")),
            *captions(runs),
            ceilings_text(runs),
            f"Every row: {shape_text(fixed, fixed)}.",
            f"*wall*: CUDA events around back-to-back calls, launch gaps included; *GPU*: the time the GPU runs the "
            "call's kernels, from torch.profiler (kernels running at once count once; the cuTile "
            f"backward's two state walks share one launch); *over {base}*: {base}'s time over the row's; "
            "GB/s: each input read once and y written once, over the GPU time; *launches*: kernels per call; "
            "*warm-up s*: the first call, timed apart.",
            "",
            table(header, rows),
        ]
    )


def sweep_section(runs: list[dict], kpool: Pool, base: str) -> str:
    """The kernel table over a shape sweep, led by the lowest GPU-time ratio over the baseline of each backend."""
    fields, _ = varying(dict(k[1]) for k in kpool)
    lowest = []
    for name in ordered(n for by in kpool.values() for n in by if n != base):
        ratios = [
            (by[name]["gpu_over_base"], key) for key, by in kpool.items() if by.get(name, {}).get("gpu_over_base")
        ]
        if ratios:
            stat, key = min(ratios, key=lambda r: r[0].median)
            lowest.append(f"{name} {cell(stat, times)} at {shape_text(dict(key[1]), fields)} ({key[0]})")
    lead = [f"Lowest GPU-time ratio over {base} across the sweep: " + "; ".join(lowest) + "."] if lowest else []
    return kernel_section(
        runs, kpool, base, "The SSD over the shape sweep (bench/bench_kernels.py --shapes sweep)", lead
    )


# ---- the SSD alone, per kernel --------------------------------------------------------------------------

OTHER = "other kernels"  # the call's kernels' summed time less that of the kernels its record lists


def traffic():
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
    """(kernel, figure) -> value for each kernel in the record's top_kernels_ms: "ms" per call and, for a cuTile
    stage, "floor_MB", "floor_us" (at the run's copy ceiling) and "of_floor" (floor over measured)."""
    top = rec.get("top_kernels_ms") or {}
    launches = rec.get("kernel_launches") or {}  # per call; absent in older JSON: one launch assumed
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
    listed = round(sum(launches.get(name, 1) for name in top))  # launches per call of the listed kernels
    summed = rec.get("gpu_kernel_sum_ms", rec.get("gpu_ms"))  # older records: one stream, GPU time is the sum
    if top and rec.get("kernels_per_call", 0) > listed and summed is not None:
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
        "GPU ms per call of each kernel a record lists (`top_kernels_ms`: torch.profiler's largest kernels of the "
        f"call; *{OTHER}*: the call's kernels' summed time less theirs, where it launched more). cuTile kernels go by "
        "their stage (kernels/cutile/*STAGE*.py) and, where a stage ran in several specializations, the constants that "
        "differ (Q: the chunk size); others by their function and the functor or template argument they were "
        "built with (#1, #2: kernels whose names shorten alike). *floor MB*: the bytes the stage must move at the "
        "row's shape and its own chunk size, each tensor it reads read once and each it writes written once "
        "(bench/traffic.py); *floor µs*: those bytes at the copy ceiling measured in the same process; "
        "*of floor*: the floor over the measured time. A kernel launched more than once per call in one "
        "specialization shows once, its time summed, against the floor of all its launches (`kernel_launches`; "
        "JSON without it: one launch's floor).",
        "",
        *parts,
    ]
    return "\n".join(lines).rstrip() if parts else "No per-kernel GPU times in the JSON (`top_kernels_ms`)."


# ---- the training step ----------------------------------------------------------------------------------


def step_key(rec: dict) -> tuple:
    return (rec["size"], rec["seqlen"], rec["batch"], step_mode(rec))


def step_mode(rec: dict) -> str:
    """eager, compile, or compile with its torch.compile mode (compile reduce-overhead: CUDA graphs), then the
    layers around the SSD that ran as cuTile kernels where any did (", cuTile conv + norm")."""
    mode = " ".join([rec["mode"], *([rec["compile_mode"]] if rec.get("compile_mode") else [])])
    cfg = rec.get("config", {})
    layers = [name for name, key in STEP_LAYERS.items() if cfg.get(key, "torch") != "torch"]
    return mode + (f", cuTile {' + '.join(layers)}" if layers else "")


def step_figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
    m = rec["median"]
    other = base is not None and base is not rec
    return {
        **{k: m.get(k) for k in STEP_COLUMNS},
        "over_base": ratio(base["median"]["step_ms"], m["step_ms"]) if other else None,
        "own_peak_gib": rec.get("own_peak_gib"),
        "tokens_per_s": rec.get("tokens_per_s"),
        "mfu": rec.get("mfu"),
        "warmup_s": rec.get("warmup_s"),
        "parameters": rec.get("parameters"),
    }


def model_config(rec: dict) -> dict:
    """A record's model config but the SSD backend and backward, which its row's backend column names, and the
    layers' backends, which its mode names."""
    return {k: v for k, v in rec["config"].items() if k not in (*BACKEND_KEYS, *STEP_LAYERS.values())}


def model_text(size: str, figures: dict[str, Stat | None]) -> str:
    params = next((f["parameters"] for f in figures.values() if f["parameters"]), None)
    if not params:
        return size
    n = params.median
    return f"{size} ({n / 1e6:.0f}M parameters)" if n >= 1e6 else f"{size} ({n / 1e3:.0f}K parameters)"


def series_keys(runs: list[dict]) -> set[tuple]:
    return {step_key(r) for run in runs for r in run["records"] if "error" not in r}


def claim_step_rows(series: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], list[str]]:
    """Each step row (model, L, batch, mode) comes from one series, never pooled across series (their settings
    may differ): the first series listed that holds a row keeps it, and it is left out of the later ones. Returns
    the series so claimed and a line for each row left out."""
    owner: dict[tuple, str] = {}
    claimed, notes = {}, []
    for name, runs in series.items():
        keys = series_keys(runs)
        taken = {k: owner[k] for k in keys if k in owner}
        owner |= {k: name for k in keys if k not in taken}
        claimed[name] = [
            {**run, "records": [r for r in run["records"] if "error" in r or step_key(r) not in taken]} for run in runs
        ]
        notes += [
            f"{name}'s rows at {size}, L {seqlen}, batch {batch}, {mode} are left out: {first}, listed first, holds them."
            for (size, seqlen, batch, mode), first in sorted(taken.items(), key=str)
        ]
    return claimed, notes


def step_section(series: list[list[dict]], spool: Pool, base: str, left_out: list[str]) -> str:
    """The step table of every step series (one per benchmark setting, e.g. compile mode), captioned per series."""
    runs = [r for s in series for r in s]
    header = ["model", "L", "batch", "mode", "backend", *STEP_COLUMNS.values(), "own peak GiB", f"step: over {base}"]
    header += ["tokens/s", "MFU", "warm-up s"]
    rows = []
    for (size, seqlen, batch, mode), by in spool.items():
        for name, f in by.items():
            rows.append(
                [model_text(size, by), str(seqlen), str(batch), mode, name]
                + [cell(f[k]) if f[k] and f[k].median else "–" for k in STEP_COLUMNS]
                + [cell(f["own_peak_gib"]) if f.get("own_peak_gib") else "–"]
                + [cell(f["over_base"]), cell(f["tokens_per_s"], "{:,.0f}".format), cell(f["mfu"], pct1)]
                + [cell(f["warmup_s"])]
            )
    configs = {r["size"]: model_config(r) for run in runs for r in run["records"] if "config" in r}
    per_size, fixed = varying(configs.values()) if configs else ([], {})
    errors = ordered(
        f"{r['size']} L {r['seqlen']} {step_mode(r)}{' ' + r['variant'] if 'variant' in r else ''}: {r['error']}"
        for run in runs
        for r in run["records"]
        if "error" in r
    )
    peak = ordered(
        p
        for run in runs
        for p in [run["settings"].get(PEAK), run["environment"].get(PEAK), *(r.get(PEAK) for r in run["records"])]
        if p
    )
    sizes = "; ".join(f"{s}: " + ", ".join(f"{k} {c[k]}" for k in per_size) for s, c in configs.items())
    lines = [
        "## The training step (bench/bench_step.py)",
        "",
        *[line for s in series for line in [*captions(s), ""]],
        "Model config of every row: " + ", ".join(f"{k} {v}" for k, v in fixed.items()) + ".",
        *([f"Per size: {sizes}."] if per_size else []),
        f"Medians over the timed steps of each run; *SSD fwd/bwd*: time inside `kernels.ssd` within the step "
        f"(– where not timed); *peak GiB*, *reserved GiB*: the most memory the process's tensors held in the step, "
        "and the most its allocator held, CUDA graphs' pools included (every variant of a run is resident at "
        "once: see *own peak* for a variant's own figure; under CUDA graphs a replay allocates nothing, so "
        "only the reserved figure bounds it; – where not recorded); *own peak GiB*: the variant's parameters, "
        "gradients and optimizer state plus what its step allocated above the step's start, i.e. its peak "
        f"alone in a process (not under CUDA graphs); *over {base}*: {base}'s step time over the "
        "row's; MFU: analytic FLOPs per token "
        "over the dense bf16 peak of the GPU"
        + (f" ({', '.join(f'{p} TFLOP/s' for p in peak)})." if peak else f" (the JSON does not record it: no {PEAK})."),
        "",
        table(header, rows),
    ]
    lines += ["", "Not measured: " + "; ".join(errors) + "."] if errors else []
    return "\n".join(lines + (["", *left_out] if left_out else []))


# ---- scaling to several GPUs ----------------------------------------------------------------------------

PHASES = ("single", "ddp", "no_sync")  # bench_scaling's phases: 1 GPU, DDP, DDP without the all-reduce
SCALING_DEFAULT = "scaling_h200x2"  # --scaling's series when present; no scaling section when absent


def scaling_key(rec: dict) -> tuple:
    return (rec["size"], rec["seqlen"], rec["batch_per_gpu"], rec["mode"], rec["world_size"])


def scaling_figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
    """A bench_scaling record's figures; per-rank ones as `<figure>@<rank>`. `base` is not used."""
    phases, allreduce = rec["phases"], rec.get("allreduce", {})
    out: dict[str, float | None] = {}
    for phase, p in ((ph, phases[ph]) for ph in PHASES if ph in phases):
        out[f"{phase}_ms"] = p["step_ms"]
        out |= {f"{phase}_ms@{i}": r["step_ms"] for i, r in enumerate(p["per_rank"])}
    for part in ("forward", "backward"):
        out |= {f"ssd_{part}_ms@{i}": r.get(f"ssd_{part}_ms") for i, r in enumerate(phases["single"]["per_rank"])}
    return out | {
        "tokens_1": phases["single"]["tokens_per_s"],
        "tokens_n": phases.get("ddp", {}).get("tokens_per_s"),
        "speedup": rec.get("speedup"),
        "efficiency": rec.get("scaling_efficiency"),
        "allreduce_MB": allreduce["bytes"] / 1e6 if "bytes" in allreduce else None,
        "allreduce_ms": allreduce.get("ms"),
        "busbw_GBps": allreduce.get("busbw_GBps"),
        "exposed_ms": rec.get("exposed_comm_ms"),
        "overlap": rec.get("overlap"),
        "warmup_ddp_s": rec.get("warmup_s", {}).get("ddp"),
        "stream_warnings": rec.get("stream_warnings"),
        "parameters": rec.get("parameters"),
    }


def ranks(f: dict[str, Stat | None], figure: str) -> list[Stat | None]:
    """The per-rank Stats of `figure`, rank 0 first."""
    n = 0
    while f"{figure}@{n}" in f:
        n += 1
    return [f[f"{figure}@{i}"] for i in range(n)]


def per_rank_cell(f: dict[str, Stat | None], figure: str, main: str | None = None) -> str:
    """`main` (the figure across ranks) with every rank's in parentheses; the ranks alone without `main`;
    – where the figure is zero on every rank (not timed)."""
    each = ranks(f, figure)
    if all(s is None or s.median == 0 for s in each) and not (main and f.get(main)):
        return "–"
    text = " / ".join(cell(s) for s in each)
    return f"{cell(f[main])} ({text})" if main else text


def scaling_section(runs: list[dict], scpool: Pool) -> str:
    world = ordered(k[4] for k in scpool) or [runs[0]["settings"].get("world_size")]
    n = " / ".join(map(str, world))
    header = ["backend", "1-GPU step ms (ranks)", "DDP step ms: slowest (ranks)", "no_sync step ms (ranks)"]
    header += ["tokens/s, 1 GPU", f"tokens/s, {n} GPUs", "speedup", "scaling efficiency", "all-reduce MB"]
    header += ["all-reduce ms", "bus GB/s", "exposed all-reduce ms", "overlap", "SSD fwd ms, 1 GPU (ranks)"]
    header += ["SSD bwd ms, 1 GPU (ranks)", "warm-up s (DDP)"]
    tables = []
    for (size, seqlen, batch, mode, gpus), by in scpool.items():
        rows = [
            [name, per_rank_cell(f, "single_ms", "single_ms"), per_rank_cell(f, "ddp_ms", "ddp_ms")]
            + [per_rank_cell(f, "no_sync_ms", "no_sync_ms")]
            + [cell(f["tokens_1"], "{:,.0f}".format), cell(f["tokens_n"], "{:,.0f}".format), cell(f["speedup"], times)]
            + [cell(f["efficiency"], pct1), cell(f["allreduce_MB"], "{:,.0f}".format), cell(f["allreduce_ms"])]
            + [cell(f["busbw_GBps"], "{:,.0f}".format), cell(f["exposed_ms"]), cell(f["overlap"], pct)]
            + [per_rank_cell(f, "ssd_forward_ms"), per_rank_cell(f, "ssd_backward_ms"), cell(f["warmup_ddp_s"])]
            for name, f in by.items()
        ]
        what = f"### {mode}: {model_text(size, by)}, L {seqlen}, batch {batch} per GPU, {gpus} GPUs"
        tables += [what, "", table(header, rows), ""]
    warned = {
        f"{name} {k[3]}": f["stream_warnings"].median
        for k, by in scpool.items()
        for name, f in by.items()
        if f["stream_warnings"] and f["stream_warnings"].median
    }
    errors = ordered(
        f"{r['variant']} {r['mode']}: {r['error']}" for run in runs for r in run["records"] if "error" in r
    )
    lines = [
        f"## Scaling to {n} GPUs (bench/bench_scaling.py)",
        "",
        *captions(runs),
        "The same per-GPU batch on 1 and on N GPUs, one process per GPU; each process times the three phases "
        "step by step in turn. *1 GPU*: the plain model, no communication, every rank timing its own at the same "
        "time (the figure is the median of the ranks'); *DDP*: the model in DistributedDataParallel, the slowest "
        "rank's step; *no_sync*: the same DDP step without the all-reduce (slowest rank). (ranks): each rank's "
        "median step, rank 0 first. tokens/s on N GPUs: N x the per-GPU tokens over the slowest DDP step; "
        "*speedup*: N-GPU over 1-GPU tokens/s; *scaling efficiency*: the 1-GPU step over the DDP step (speedup / "
        "N). *all-reduce*: one all-reduce of every gradient at once (float32), its time and bus bandwidth "
        "2 (N - 1) / N x bytes / time; *exposed*: DDP step - no_sync step; *overlap*: 1 - exposed / all-reduce "
        "time (below 0: the exposed time exceeds one whole all-reduce). *SSD fwd/bwd*: time inside `kernels.ssd` "
        "in the 1-GPU step, per rank (– where not timed: compiled). *warm-up s (DDP)*: the DDP phase's warm-up "
        "steps, compilation and autotuning included, slowest rank.",
        "AccumulateGrad stream warnings: "
        + ("; ".join(f"{k}: {v:.0f}" for k, v in warned.items()) if warned else "none in any record")
        + ".",
        "",
        *tables,
    ]
    return "\n".join(lines + (["Not measured: " + "; ".join(errors) + "."] if errors else [])).rstrip()


# ---- Amdahl ---------------------------------------------------------------------------------------------


def isolated_key(kpool: Pool, rec: dict, mode: str) -> tuple | None:
    """The kernel-benchmark shape of `mode` at the step's sequence length and SSD dimensions; among several,
    the one with the step's batch and number of heads too; None when there is no single one."""
    cfg = rec.get("config", {})

    def same_problem(shape: dict) -> bool:
        both = [(shape[s], cfg[c]) for s, c in SHAPE_IN_CONFIG.items() if s in shape and c in cfg]
        return shape.get("seqlen") == rec["seqlen"] and all(a == b for a, b in both)

    keys = [k for k in kpool if k[0] == mode and same_problem(dict(k[1]))]
    if len(keys) > 1 and {"expand", "d_model", "headdim"} <= cfg.keys():
        heads = cfg["expand"] * cfg["d_model"] // cfg["headdim"]
        keys = [k for k in keys if (dict(k[1]).get("batch"), dict(k[1]).get("nheads")) == (rec["batch"], heads)]
    return keys[0] if len(keys) == 1 else None


def reconcile_figures(kpool: Pool) -> Callable[[dict, dict | None, dict], dict]:
    def figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
        b, x = (base or {}).get("median", {}), rec["median"]
        marks = has_ssd_marks(base or {}) and has_ssd_marks(rec)  # one source for both, or the subtraction
        b_ssd, x_ssd = ssd_ms(base or {}, marks), ssd_ms(rec, marks)
        if base is None or base is rec or not ratio(b_ssd, x_ssd):
            return {"measured": None}
        k_iso = {}
        clock = "gpu_over_base" if rec.get("compile_mode") in GRAPH_MODES else "wall_over_base"
        for mode in ("fwd_bwd", "fwd"):
            key = isolated_key(kpool, rec, mode)
            stat = kpool[key].get(label(rec), {}).get(clock) if key else None
            k_iso[mode] = stat.median if stat else None
        s, s_fwd = b_ssd / b["step_ms"], (b["ssd_forward_ms"] / b["step_ms"] if marks else None)
        k_in, k_in_fwd = b_ssd / x_ssd, ratio(b["ssd_forward_ms"], x["ssd_forward_ms"])
        measured = b["step_ms"] / x["step_ms"]
        predicted_iso = amdahl(s, k_iso["fwd_bwd"]) if k_iso["fwd_bwd"] else None
        return {
            "measured": measured,
            "ssd_share_base": s,
            "k_isolated_fwd_bwd": k_iso["fwd_bwd"],
            "predicted_from_isolated": predicted_iso,
            "measured_vs_isolated": measured / predicted_iso - 1 if predicted_iso else None,
            "k_in_step": k_in,
            "predicted_from_in_step": amdahl(s, k_in) if marks else None,  # by subtraction: = measured
            "ssd_fwd_share_base": s_fwd,
            "k_isolated_fwd": k_iso["fwd"],
            "k_in_step_fwd": k_in_fwd,
            "forward_only_prediction": amdahl(s_fwd, k_in_fwd) if k_in_fwd and s_fwd else None,
            "non_ssd_ms": x["step_ms"] - x_ssd,
            "non_ssd_ms_base": b["step_ms"] - b_ssd,
            "ssd_by_subtraction": float(not marks),
        }

    return figures


def has_ssd_marks(rec: dict) -> bool:
    return bool(rec.get("median", {}).get("ssd_forward_ms"))


def ssd_ms(rec: dict, marks: bool) -> float | None:
    """The SSD's time in a step: its own marks (eager steps) if `marks`, else the step minus the stand-in step."""
    m = rec.get("median", {})
    return m["ssd_forward_ms"] + m["ssd_backward_ms"] if marks else rec.get("ssd_ms_by_subtraction")


def reconcile(step_runs: list[dict], spool: Pool, kpool: Pool, base: str) -> list[dict]:
    """Amdahl predictions of each backend's step speedup over the baseline, one row per step shape and backend."""
    rows = []
    for key, by in pool(step_runs, step_key, reconcile_figures(kpool), base).items():
        for name, f in by.items():
            if f.get("measured"):
                size, seqlen, batch, mode = key
                row = {"size": size, "model": model_text(size, spool[key]), "seqlen": seqlen, "batch": batch}
                row |= {"mode": mode, "backend": name, "baseline": base}
                rows.append(row | {k: asdict(v) if v else None for k, v in f.items()})
    return rows


def ssd_source(row: dict) -> str:
    flag = row["ssd_by_subtraction"]
    return "stand-in" if flag and flag["median"] else "marks"


def reconcile_section(rec: list[dict], base: str, kpool: Pool) -> str:
    def c(row: dict, k: str, fmt: Callable[[float], str] = num) -> str:
        return cell(Stat(**row[k]) if row[k] else None, fmt)

    rows = [
        [r["model"], str(r["seqlen"]), str(r["batch"]), r["mode"], r["backend"], ssd_source(r)]
        + [c(r, "ssd_share_base", pct)]
        + [c(r, k) for k in ("k_isolated_fwd_bwd", "predicted_from_isolated", "k_in_step", "predicted_from_in_step")]
        + [c(r, "measured"), c(r, "measured_vs_isolated", "{:+.0%}".format), c(r, "ssd_fwd_share_base", pct)]
        + [c(r, "k_in_step_fwd"), c(r, "forward_only_prediction")]
        for r in rec
    ]
    header = ["model", "L", "batch", "mode", "backend", "SSD time", f"SSD share ({base} step)", "k isolated fwd+bwd"]
    header += ["predicted", "k in step", "predicted", "measured", "measured vs isolated prediction"]
    header += ["SSD fwd share", "k fwd in step", "step speedup if only the forward changed"]
    lengths = ", ".join(map(str, sorted({dict(k[1]).get("seqlen") for k in kpool} - {None})))
    blank = [r for r in rec if not r["k_isolated_fwd_bwd"]]
    blank_text = (
        f" *k isolated* and its prediction are blank where the SSD-alone series has no single shape at the step's "
        f"L and SSD dimensions (among several, none with the step's batch and heads; it holds L {lengths}; the "
        "step rows: L " + ", ".join(map(str, ordered(r["seqlen"] for r in blank))) + ")."
        if blank
        else ""
    )
    return "\n".join(
        [
            "## Isolated speedup vs step speedup (Amdahl)",
            "",
            f"Speedups are the backend's over {base} (above 1: faster). s is the SSD's share of the {base} step; "
            "*k isolated* is the ratio from the SSD-alone benchmark at the same L and SSD dimensions, of wall "
            "clock, or of GPU time for steps replayed as CUDA graphs (compile modes reduce-overhead and "
            "max-autotune), whose launches cost the host nothing; "
            "*k in step* the ratio of the SSD's own time inside the step; predicted = 1 / ((1 - s) + s / k). "
            "*SSD time*: *marks*, the SSD's own CUDA events (eager steps); *stand-in*, the step's time minus the "
            "stand-in step's (compiled graphs carry no marks; used for both backends of a row unless both have "
            "marks), which leaves out the forward-only columns and the in-step prediction (it would equal the "
            "measured speedup by construction). "
            f"The last column is the step speedup had only the SSD forward changed (the backend's forward, "
            f"{base}'s backward)." + blank_text,
            "",
            table(header, rows) if rows else f"No step shape holds both {base} and another backend with SSD times.",
        ]
    )


# ---- headline, captions, plots --------------------------------------------------------------------------


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


def setting(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def runs_text(runs: list[dict]) -> str:
    return f"{len(runs)} run" + "s" * (len(runs) > 1)


def step_runs(by: dict[str, dict[str, Stat | None]], base: str) -> int:
    """In how many runs every backend of a step row has its ratio over the baseline (the fewest of them)."""
    ns = [f["over_base"].n if f.get("over_base") else 0 for n, f in by.items() if n not in (base, STANDIN)]
    return min(ns, default=0)


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
    return "\n\n".join(parts + missing)


def plots(kpool: Pool, spool: Pool, rec: list[dict], base: str, gpu: str, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, name: str) -> Path:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        return out_dir / name

    def bar_err(stat: Stat | None) -> tuple[float, list[float]]:
        return (stat.median, [stat.median - stat.min, stat.max - stat.median]) if stat else (0.0, [0.0, 0.0])

    paths = []
    modes = ordered(k[0] for k in kpool)
    fields, _ = varying(dict(k[1]) for k in kpool)
    others = [f for f in fields if f != "seqlen"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.8), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        keys = [k for k in kernel_keys(kpool) if k[0] == mode]
        series = ordered((n, tuple(dict(k[1])[f] for f in others)) for k in keys for n in kpool[k] if n != base)
        for i, (name, rest) in enumerate(series):
            pts = [
                (dict(k[1]), kpool[k][name])
                for k in keys
                if name in kpool[k] and tuple(dict(k[1])[f] for f in others) == rest
            ]
            what = ", ".join([name, *(f"{SHAPE_NAMES.get(f, f)}={v}" for f, v in zip(others, rest))])
            for clock, style in (("wall_over_base", "o-"), ("gpu_over_base", "^--")):
                xy = [(s.get("seqlen", j), f[clock]) for j, (s, f) in enumerate(pts) if f[clock]]
                if xy:
                    ax.errorbar(
                        [x for x, _ in xy],
                        [st.median for _, st in xy],
                        yerr=[[st.median - st.min for _, st in xy], [st.max - st.median for _, st in xy]],
                        fmt=style,
                        color=f"C{i}",
                        label=f"{what}, {'wall clock' if clock == 'wall_over_base' else 'GPU time'}",
                    )
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", title=MODE_NAMES.get(mode, mode), xlabel="sequence length")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0][0].set_ylabel(f"speedup over {base}")
    axes[0][-1].legend(fontsize=6)
    paths.append(save(fig, "kernel_speedup.png"))

    parts = [
        ("SSD fwd", "#1f77b4", lambda m: m["ssd_forward_ms"]),
        ("other fwd", "#aec7e8", lambda m: m["forward_ms"] - m["ssd_forward_ms"]),
        ("SSD bwd", "#d62728", lambda m: m["ssd_backward_ms"]),
        ("other bwd", "#ff9896", lambda m: m["backward_ms"] - m["ssd_backward_ms"]),
        ("optimizer", "#7f7f7f", lambda m: m["optimizer_ms"]),
    ]
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * sum(len(by) for by in spool.values())), 4.8))
    ticks, x = [], 0.0
    for (size, seqlen, _, mode), by in spool.items():
        for name, f in by.items():
            medians = {k: (v.median if v else 0.0) for k, v in f.items()}
            bottom = 0.0
            for part, color, value in parts:
                ax.bar(x, value(medians), bottom=bottom, color=color, label=part if not ticks else None)
                bottom += value(medians)
            ticks.append((x, "\n".join([size, f"L={seqlen}", textwrap.fill(mode, 12), textwrap.fill(name, 12)])))
            x += 1
        x += 0.5
    ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=6)
    ax.set(ylabel="ms per training step (medians)", title=f"Training-step breakdown per SSD backend ({gpu})")
    ax.legend(fontsize=8)
    paths.append(save(fig, "step_breakdown.png"))

    if rec:
        fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(rec)), 4.2))
        bars = (
            ("predicted_from_isolated", "predicted (isolated k)"),
            ("predicted_from_in_step", "predicted (in-step k)"),
        )
        shown = [(k, name) for k, name in (*bars, ("measured", "measured")) if any(r[k] for r in rec)]
        for j, (k, name) in enumerate(shown):
            stats = [bar_err(Stat(**r[k]) if r[k] else None) for r in rec]
            xs = [i + 0.2 * (j - (len(shown) - 1) / 2) for i in range(len(rec))]
            ax.bar(xs, [m for m, _ in stats], 0.2, yerr=list(zip(*[e for _, e in stats])), label=name)
        ax.axhline(1.0, color="gray", lw=0.8)
        names = [
            f"{r['size']} L={r['seqlen']}\n{textwrap.fill(r['mode'], 22)}\n{textwrap.fill(r['backend'], 22)}"
            for r in rec
        ]
        ax.set_xticks(range(len(rec)), names, fontsize=7)
        ax.set_ylabel(f"step speedup over {base}")
        ax.legend(fontsize=8)
        paths.append(save(fig, "amdahl.png"))
    return paths


def scaling_plot(scpool: Pool, gpu: str, runs: str, out_dir: Path) -> Path:
    """results/scaling.png: tokens/s on 1 and on N GPUs per backend, one panel per step shape and mode; a black
    tick at N x the 1-GPU figure (perfect scaling); error bars span the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(scpool)
    width = max(5, 1.6 * max(len(by) for by in scpool.values()))
    fig, axes = plt.subplots(1, len(keys), figsize=(width * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        size, seqlen, batch, mode, gpus = key
        names = list(scpool[key])
        for j, (fig_name, what) in enumerate((("tokens_1", "1 GPU"), ("tokens_n", f"{gpus} GPUs (DDP)"))):
            stats = [scpool[key][n][fig_name] for n in names]
            xs = [i + 0.4 * (j - 0.5) for i in range(len(names))]
            heights = [st.median if st else 0.0 for st in stats]
            err = [
                [st.median - st.min if st else 0.0 for st in stats],
                [st.max - st.median if st else 0.0 for st in stats],
            ]
            ax.bar(xs, heights, 0.4, yerr=err, color=f"C{j}", label=what)
        ideal = [(i, gpus * f["tokens_1"].median) for i, f in enumerate(scpool[key].values()) if f["tokens_1"]]
        ax.hlines([y for _, y in ideal], [i for i, _ in ideal], [i + 0.4 for i, _ in ideal], color="k")
        ax.plot([], [], color="k", label=f"{gpus} x the 1-GPU tokens/s")
        ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.set(ylabel="tokens/s", title=f"{mode}: {size}, L {seqlen}, batch {batch} per GPU ({gpu}, {runs})")
        ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = out_dir / "scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- main -----------------------------------------------------------------------------------------------


def relative(path: Path, start: Path) -> str:
    try:
        return str(path.resolve().relative_to(start.resolve()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = ap.parse_args(argv)

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
    (args.results / "reconciliation.json").write_text(json.dumps(rec, separators=(",", ":")) + "\n")

    out = args.out / "BENCHMARKS.md"
    sources = ", ".join(f"{relative(r['file'], args.out)}" for r in [*krun, *swrun, *srun, *scrun])
    notes = args.results / "notes.md"
    head = headline(kpool, spool, krun, sseries, base, gpu, scpool, scrun)
    command = f"python -m bench.report --kernels {args.kernels} --step {args.step}"
    command += (f" --scaling {scaling}" if scaling else "") + (f" --sweep {args.sweep}" if args.sweep else "")
    command += f" --baseline {base}" if base != "triton" else ""
    parts = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` from {sources}; do not edit by hand."
        + (
            f" What these figures were taken to mean, dated, is in {relative(notes, args.out)}."
            if notes.is_file()
            else ""
        ),
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
    ]
    out.write_text("\n".join(parts) + "\n")
    written = [out, *pngs, args.results / "reconciliation.json"]
    readme = args.out / "README.md"
    if readme.is_file() and HEADLINE_START in readme.read_text():
        block = f"{HEADLINE_START}\n{head}\n{HEADLINE_END}"
        pattern = re.escape(HEADLINE_START) + ".*?" + re.escape(HEADLINE_END)
        readme.write_text(re.sub(pattern, lambda _: block, readme.read_text(), flags=re.S))
        written.append(readme)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
