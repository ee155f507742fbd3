"""Document boundaries in the training step (bench/bench_step.py --documents): per variant and packed documents,
the step, its cost over the same variant without boundaries and triton's step over it, each taken within one run
(process) before pooling across runs as median [min–max]."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from bench.documents import DOCUMENTS  # the rows' order ("none": no boundaries)
from bench.kernel_names import KINDS, kind_of
from bench.report.format import Stat, cell, ordered, ratio, runs_text, table, times
from bench.report.series import env_value

# --boundaries's series (NAME.json, NAME_run<N>.json), each rendered when present: bench/headline.sh boundaries's
BOUNDARIES_DEFAULT = "step_h200_boundaries,step_h100_boundaries"
NOT_CUTILE = ("triton", "torch", "standin")  # variants starting with these are not cuTile's
ENV_KEYS = {"driver": "driver", "torch": "torch", "triton": "triton", "cuda_tile": "cuda-tile"}
ENV_KEYS |= {"mamba_ssm": "mamba_ssm", "lightning": "lightning"}

TOP_KERNELS = 8  # the per-kernel table's rows: the kernels whose time boundaries change most, then all kernels
ALL_KERNELS = "all kernels"
IDLE = "idle between kernels"  # the profile's idle_ms: no kernel running (records of bench_step that measure it)
Shape = tuple[str, int, int, str]  # (model size, L, batch, mode)
Row = tuple[str, str]  # (documents, variant)


def environment_text(envs: Iterable[dict]) -> str:
    """The environment as first_step's caption gives it ("NVIDIA H200, driver 580, torch 2.11, ..., 2026-12-04"),
    each value once, "A / B" where runs differ; "none" for a package a run lacked."""
    runs = [{"environment": e} for e in envs]
    values = {k: " / ".join(ordered(env_value(r, k) for r in runs)) for k in ["gpu", *ENV_KEYS]}
    dates = " / ".join(ordered(str(r["environment"].get("date", "none"))[:10] for r in runs))
    return ", ".join([values["gpu"], *(f"{name} {values[k]}" for k, name in ENV_KEYS.items()), dates])


def documents_rank(documents: str) -> int:
    """Where a documents kind's rows go: DOCUMENTS' order, any other kind after them."""
    return DOCUMENTS.index(documents) if documents in DOCUMENTS else len(DOCUMENTS)


def shape_of(rec: dict) -> Shape:
    """A bench_step record's (size, L, batch, mode), the mode with its torch.compile mode where set."""
    mode = " ".join([rec["mode"], *([rec["compile_mode"]] if rec.get("compile_mode") else [])])
    return (rec["size"], rec["seqlen"], rec["batch"], mode)


def is_cutile(variant: str) -> bool:
    """Whether a bench_step variant runs a cuTile SSD (every variant but triton's, torch's and the stand-in)."""
    return not variant.startswith(NOT_CUTILE)


def triton_twin(variant: str) -> str:
    """The triton variant a cuTile variant is taken over: the same layers around the SSD ("cutile_bwd+conv+norm"
    -> "triton+conv+norm"), so that only the SSD differs."""
    return "+".join(["triton", *variant.split("+")[1:]])


def run_figures(run: dict) -> dict[Shape, dict[Row, dict[str, float | None]]]:
    """One run's figures per shape and (documents, variant; "none" where a record names none), failed records
    skipped: step_ms, tokens_per_s, cost (step over the same variant's step with documents "none") and over_triton
    (its triton_twin's step at the same documents over this cuTile variant's; None for other variants or without
    that row)."""
    steps: dict[Shape, dict[Row, dict]] = {}
    for rec in run["records"]:
        if "error" not in rec:
            steps.setdefault(shape_of(rec), {})[(rec.get("documents", "none"), rec["variant"])] = rec
    out: dict[Shape, dict[Row, dict[str, float | None]]] = {}
    for shape, by in steps.items():

        def step(documents: str, variant: str, by: dict[Row, dict] = by) -> float | None:
            rec = by.get((documents, variant))
            return rec["median"]["step_ms"] if rec else None

        out[shape] = {
            (docs, variant): {
                "step_ms": rec["median"]["step_ms"],
                "tokens_per_s": rec.get("tokens_per_s"),
                "cost": ratio(step(docs, variant), step("none", variant)) if docs != "none" else None,
                "over_triton": ratio(step(docs, triton_twin(variant)), step(docs, variant))
                if is_cutile(variant)
                else None,
            }
            for (docs, variant), rec in by.items()
        }
    return out


def boundaries_pool(runs: list[dict]) -> dict[Shape, dict[Row, dict[str, Stat | None]]]:
    """Each figure of run_figures across runs (format.Stat); rows in documents order (DOCUMENTS, then any other),
    variants in the JSON's order."""
    per_run = [run_figures(run) for run in runs]
    pooled: dict[Shape, dict[Row, dict[str, Stat | None]]] = {}
    for shape in ordered(s for figs in per_run for s in figs):
        rows = ordered(r for figs in per_run for r in figs.get(shape, {}))
        rows.sort(key=lambda r: documents_rank(r[0]))  # stable
        found = [[figs[shape][row] for figs in per_run if row in figs.get(shape, {})] for row in rows]
        pooled[shape] = {
            row: {k: Stat.of(f[k] for f in fs) for k in ("step_ms", "tokens_per_s", "cost", "over_triton")}
            for row, fs in zip(rows, found)
        }
    return pooled


def kernel_ms(rec: dict) -> dict[str, float] | None:
    """A record's profiled GPU ms per step by kernel (bench_step.step_profile's names), ALL_KERNELS their sum and,
    where the profile measured it, IDLE; None for a record without a profile (bench_step without --profile)."""
    profile = rec.get("profile") or {}
    by_name = profile.get("kernels_ms")
    if not by_name:
        return None
    idle = {IDLE: profile["idle_ms"]} if profile.get("idle_ms") is not None else {}
    return {**by_name, ALL_KERNELS: sum(by_name.values()), **idle}


def kind_ms(rec: dict) -> dict[str, float] | None:
    """kernel_ms's figures summed by kind (bench.kernel_names.kind_of): every one of KINDS, then ALL_KERNELS and,
    where measured, IDLE; None without a profile."""
    by_kernel = kernel_ms(rec)
    if by_kernel is None:
        return None
    kinds = dict.fromkeys(KINDS, 0.0)
    for name, ms in by_kernel.items():
        if name not in (ALL_KERNELS, IDLE):
            kinds[kind_of(name)] += ms
    return kinds | {k: by_kernel[k] for k in (ALL_KERNELS, IDLE) if k in by_kernel}


def kernel_pool(
    runs: list[dict], figures: Callable[[dict], dict[str, float] | None] = kernel_ms
) -> dict[Shape, dict[Row, dict[str, tuple[Stat | None, Stat | None]]]]:
    """Per shape, row and kernel (or what `figures` names: kind_ms's kinds): (ms per step, its change over the same
    variant's row with documents none, taken within each run), each a Stat across the runs that profiled both rows;
    a kernel a row lacks counts 0 ms."""
    per_run: list[dict[Shape, dict[Row, dict[str, float]]]] = []
    for run in runs:
        figs: dict[Shape, dict[Row, dict[str, float]]] = {}
        for rec in run["records"]:
            if "error" not in rec and (ms := figures(rec)) is not None:
                figs.setdefault(shape_of(rec), {})[(rec.get("documents", "none"), rec["variant"])] = ms
        per_run.append(figs)
    pooled: dict[Shape, dict[Row, dict[str, tuple[Stat | None, Stat | None]]]] = {}
    for shape in ordered(s for figs in per_run for s in figs):
        rows = ordered(r for figs in per_run for r in figs.get(shape, {}))
        variants = ordered(v for _, v in rows)  # variants together, each's documents in DOCUMENTS order
        rows.sort(key=lambda r: (variants.index(r[1]), documents_rank(r[0])))
        pooled[shape] = {}
        for docs, variant in rows:
            both = [f for f in (figs.get(shape, {}) for figs in per_run) if (docs, variant) in f]
            both = [f for f in both if ("none", variant) in f or docs == "none"]
            names = ordered(k for f in both for k in f[(docs, variant)])
            pooled[shape][(docs, variant)] = {
                k: (
                    Stat.of(f[(docs, variant)].get(k, 0.0) for f in both),
                    None
                    if docs == "none"
                    else Stat.of(f[(docs, variant)].get(k, 0.0) - f[("none", variant)].get(k, 0.0) for f in both),
                )
                for k in names
            }
    return pooled


def kernel_rows(
    by: dict[Row, dict[str, tuple[Stat | None, Stat | None]]], shown: list[str] | None = None, what: str = "kernel"
) -> tuple[list[str], list[list[str]]]:
    """The per-kernel table of one shape (header, rows): a column per row of `by`, a row per name of `shown` (by
    default the TOP_KERNELS kernels whose median change is largest), then ALL_KERNELS and, where measured, IDLE; a
    cell is the median ms, with its median change in parentheses; `what` heads the first column. Kernels' names are shown as code, kind_ms's kinds
    as they are."""
    if shown is None:
        changes: Counter[str] = Counter()
        for figs in by.values():
            for k, (_, change) in figs.items():
                if change is not None and k not in (ALL_KERNELS, IDLE):
                    changes[k] = max(changes[k], abs(change.median))
        shown = [k for k, _ in changes.most_common(TOP_KERNELS)]
    shown = [*shown, ALL_KERNELS] + ([IDLE] if any(IDLE in figs for figs in by.values()) else [])

    def text(figs: dict[str, tuple[Stat | None, Stat | None]], k: str) -> str:
        ms, change = figs.get(k, (None, None))
        return "" if ms is None else f"{ms.median:.2f}" + (f" ({change.median:+.2f})" if change else "")

    plain = (ALL_KERNELS, IDLE, *KINDS)
    header = [what, *(f"{variant} {docs}" for docs, variant in by)]
    return header, [[k if k in plain else f"`{k}`", *(text(figs, k) for figs in by.values())] for k in shown]


def command(run: dict) -> str:
    """The bench_step command line a run's settings give (its modes, variants, documents, steps)."""
    s = run["settings"]
    options = {k: s.get(k) for k in ("configs", "seqlens", "modes", "backends", "documents", "warmup", "steps")}
    return "python -m bench.bench_step " + " ".join(f"--{k} {v}" for k, v in options.items() if v is not None)


def signed_pct(v: float) -> str:
    """A ratio as the change it is: 1.041 -> "+4.1%"."""
    return f"{100 * (v - 1):+.1f}%"


def boundaries_rows(by: dict[Row, dict[str, Stat | None]]) -> list[list[str]]:
    """The table rows of one shape: documents, variant, step ms, tokens/s, vs no boundaries, over triton."""
    return [
        [
            docs,
            variant,
            cell(f["step_ms"], "{:.2f}".format),
            cell(f["tokens_per_s"], "{:,.0f}".format),
            cell(f["cost"], signed_pct) or "–",
            cell(f["over_triton"], times) or "–",
        ]
        for (docs, variant), f in by.items()
    ]


def failures(runs: list[dict]) -> list[str]:
    """One line per failed record: its file, what it measured and its error."""
    lines = []
    for run in runs:
        for rec in run["records"]:
            if "error" in rec:
                what = [f"{rec.get('size', '?')} L {rec.get('seqlen', '?')}", rec.get("mode", "?")]
                what += [rec[k] for k in ("compile_mode", "variant") if rec.get(k)]
                what += [f"documents {rec['documents']}"] if rec.get("documents") else []
                lines.append(f"- Failed, {run['file'].name}: {' '.join(what)}: {rec['error']}")
    return lines


KERNEL_CAPTION = (
    "Where the time goes (bench_step --profile: one profiled step per row after the timed ones): GPU ms per step by "
    f"kernel, median across runs; in parentheses the change over the same variant with documents none, taken within "
    f"each run; the {TOP_KERNELS} kernels that change most, then all kernels:"
)


KIND_CAPTION = (
    "The same GPU time by kind of kernel (bench.kernel_names.kind_of; the kernels under 0.25 ms each, summed in the "
    "profile, count as other):"
)


def boundaries_section(runs: list[dict]) -> str:
    """The section for one bench_step series with packed documents (`runs`: series.load_series's runs)."""
    pooled = boundaries_pool(runs)
    header = ["documents", "variant", "step ms", "tokens/s", "vs no boundaries", "over triton"]
    lines = [
        f"## Document boundaries in the training step (bench/bench_step.py, {', '.join(r['file'].name for r in runs)})",
        "",
        f"`{command(runs[0])}`, {runs_text(runs)} (one process each). "
        f"{environment_text(r['environment'] for r in runs)}. *documents*: the packed documents of every step "
        "(bench/documents.py; none: no boundaries); *step ms*: median over a run's timed steps; *vs no "
        "boundaries*: the variant's step over its own step with documents none, in the same run; *over triton*: "
        "the step of triton with the same layers over the cuTile variant's at the same documents, in the same run; median [min–max] across "
        "runs.",
    ]
    kernels, kinds = kernel_pool(runs), kernel_pool(runs, kind_ms)
    for shape, by in pooled.items():
        size, seqlen, batch, mode = shape
        n = max((f["step_ms"].n for f in by.values() if f["step_ms"]), default=0)  # runs that measured it
        caption = f"{size}, L {seqlen}, batch {batch}, {mode}, {n} run{'s' * (n > 1)}:"
        lines += ["", caption, "", table(header, boundaries_rows(by))]
        if kernels.get(shape):
            lines += ["", KERNEL_CAPTION, "", table(*kernel_rows(kernels[shape]))]
            lines += ["", KIND_CAPTION, "", table(*kernel_rows(kinds[shape], list(KINDS), "kind"))]
    errors = failures(runs)
    return "\n".join(lines + (["", *errors] if errors else []))
