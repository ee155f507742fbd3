"""The training step (bench/bench_step.py): one row per model, L, batch, mode and backend, each step series
captioned apart; a row comes from one series only (claim_step_rows)."""

from __future__ import annotations

from bench.report.format import Stat, cell, ordered, pct1, ratio, table
from bench.report.kernels import varying
from bench.report.series import Pool, captions
from bench.results import STEP_LAYERS

STANDIN = "standin"  # bench_step's row with the SSD replaced by y = x·D: the rest of the step, not a backend
BACKEND_KEYS = ("ssd_backend", "ssd_backward")  # model config fields a record's backend label already gives
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


def step_key(rec: dict) -> tuple:
    """(model size, L, batch, mode as step_mode writes it): a bench_step record's pool key."""
    return (rec["size"], rec["seqlen"], rec["batch"], step_mode(rec))


def step_mode(rec: dict) -> str:
    """eager, compile, or compile with its torch.compile mode (compile reduce-overhead: CUDA graphs), then the
    layers around the SSD that ran as cuTile kernels where any did (", cuTile conv + norm")."""
    mode = " ".join([rec["mode"], *([rec["compile_mode"]] if rec.get("compile_mode") else [])])
    cfg = rec.get("config", {})
    layers = [name for name, key in STEP_LAYERS.items() if cfg.get(key, "torch") != "torch"]
    return mode + (f", cuTile {' + '.join(layers)}" if layers else "")


def step_figures(rec: dict, base: dict | None, run: dict) -> dict[str, float | None]:
    """A bench_step record's figures: its STEP_COLUMNS medians, the others it records, and the baseline's step
    time over its own."""
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


def model_text(size: str, figures: dict[str, dict[str, Stat | None]]) -> str:
    """A model size with its parameter count from a step row's figures: "mini (7M parameters)"."""
    params = next((f["parameters"] for f in figures.values() if f["parameters"]), None)
    if not params:
        return size
    n = params.median
    return f"{size} ({n / 1e6:.0f}M parameters)" if n >= 1e6 else f"{size} ({n / 1e3:.0f}K parameters)"


def series_keys(runs: list[dict]) -> set[tuple]:
    """The step rows a series measured (records that did not fail)."""
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


def step_runs(by: dict[str, dict[str, Stat | None]], base: str) -> int:
    """In how many runs every backend of a step row has its ratio over the baseline (the fewest of them)."""
    ns = [f["over_base"].n if f.get("over_base") else 0 for n, f in by.items() if n not in (base, STANDIN)]
    return min(ns, default=0)
