"""Training curves (bench/curves.py): train.py runs that differ in a few arguments, one process each: their exit,
steady step, training loss at the end and validation loss per validation step, and a plot of the loss curves."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from bench.report.boundaries import environment_text
from bench.report.format import table
from bench.report.plots import pyplot, save

CURVES_DEFAULT = "boundaries_medium_h200"  # --curves's file (NAME.json) when present; no section when absent
TAIL = 0.1  # the training loss shown is the mean over this last fraction of a run's logged steps
STEP_MS, TOKENS_S = "time/step_ms", "throughput/tokens_per_s"  # the step timer's summary keys (steady medians)
FIGSIZE = (6.0, 3.5)  # inches at plots.DPI (100): 600 x 350 pixels


def tail_mean(points: list[list[float]], fraction: float = TAIL) -> float | None:
    """The mean loss of the last ceil(fraction x n) of n [step, loss] points (at least one); None without points."""
    if not points:
        return None
    k = max(1, math.ceil(fraction * len(points)))
    return statistics.fmean(loss for _, loss in points[-k:])


def val_steps(records: list[dict]) -> list[int]:
    """Every step at which some run logged a validation loss, in order."""
    return sorted({int(step) for rec in records for step, _ in rec.get("val_loss", [])})


def curves_command(settings: dict, records: list[dict]) -> str:
    """The bench/curves.py command line that writes this JSON (but --out)."""
    runs = " ".join(f"--run {rec['label']}={','.join(rec['args'])}" for rec in records)
    common = " ".join(settings.get("train_args") or [])
    return f"python -m bench.curves --config {settings['config']} --steps {settings['steps']} {runs}" + (
        f" -- {common}" if common else ""
    )


def curves_rows(records: list[dict], steps: list[int]) -> list[list[str]]:
    """One table row per run: label, arguments, exit code, steady step ms, tokens/s, the tail training loss and
    the validation loss at each of `steps` ("—" where a run has no such figure)."""
    rows = []
    for rec in records:
        steady, val = rec.get("steady") or {}, {int(s): v for s, v in rec.get("val_loss", [])}
        train = tail_mean(rec.get("train_loss", []))
        rows.append(
            [
                rec["label"],
                " ".join(f"`{a}`" for a in rec["args"]),
                str(rec["exit_code"]),
                f"{steady[STEP_MS]:.2f}" if STEP_MS in steady else "—",
                f"{steady[TOKENS_S] / 1e3:.0f}k" if TOKENS_S in steady else "—",
                f"{train:.3f}" if train is not None else "—",
                *(f"{val[s]:.3f}" if s in val else "—" for s in steps),
            ]
        )
    return rows


def curves_plot(data: dict, path: Path) -> Path:
    """Write `path` (a ~600 x 350 px PNG): training loss against step, one line per run, its validation losses as
    markers of its colour; returns `path`."""
    _, plt = pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for i, rec in enumerate(data["records"]):
        train, val = rec.get("train_loss", []), rec.get("val_loss", [])
        if train:
            ax.plot([s for s, _ in train], [v for _, v in train], color=f"C{i}", lw=0.8, label=f"{rec['label']} train")
        if val:
            ax.plot([s for s, _ in val], [v for _, v in val], "o", color=f"C{i}", ms=4, label=f"{rec['label']} val")
    settings = data["settings"]
    ax.set(xlabel="step", ylabel="loss", title=f"{settings['config']}, {settings['steps']} steps")
    ax.title.set_fontsize(8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    return save(fig, path)


def curves_section(data: dict, source: Path, png: str) -> str:
    """The section for one bench/curves.py JSON (`data`, read from `source`); `png` links its plot (curves_plot)."""
    settings, records = data["settings"], data["records"]
    steps = val_steps(records)
    header = ["run", "arguments", "exit code", "steady step (ms)", "tokens/s", f"train loss, last {TAIL:.0%}"]
    header += [f"val loss @ {s}" for s in steps]
    train_args = " ".join(f"`{a}`" for a in settings.get("train_args") or []) or "none"
    return "\n".join(
        [
            f"## Training curves (bench/curves.py, {source.name})",
            "",
            f"`{curves_command(settings, records)}`: config {settings['config']}, {settings['steps']} steps, "
            f"arguments of every run {train_args}; one process per run, one after the other on the same caches. "
            f"{environment_text([data['environment']])}. *steady step*, *tokens/s*: the step timer's medians over "
            f"the steps after warm-up; *train loss, last {TAIL:.0%}*: the mean over the last {TAIL:.0%} of the "
            "run's logged steps; *val loss @ N*: the validation loss at step N (— where the run has none).",
            "",
            table(header, curves_rows(records, steps)),
            "",
            f"![{Path(png).stem}]({png})",
        ]
    )
