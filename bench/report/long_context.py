"""Long context (bench/curves.py on configs/long.yaml): per sequence length, each SSD variant's steady step,
tokens/s, memory and the loss it ended at, pooled over the processes of the series as median [min–max], and each
variant's step over the cuTile variant's, taken within each process before pooling."""

from __future__ import annotations

import math

from bench.report.boundaries import environment_text
from bench.report.curves import STEP_MS, TOKENS_S, curves_command
from bench.report.format import Stat, cell, num, ordered, ratio, runs_text, table, times

# --long's series (NAME.json, NAME_run<N>.json), each rendered when present
LONG_DEFAULT = ",".join(
    f"long_{shape}{seed}"
    for shape in ("65536_h200", "65536_h100", "16384_h200", "16384_h100", "131072_h200", "131072_h100")
    for seed in ("", "_seed")
)
RESERVED, PEAK = "memory/reserved_gib", "memory/peak_gib"  # the step timer's summary keys (steady medians)
BASE = "cutile"  # the label every "X over BASE" ratio is taken over: triton's step over it, above 1 = cuTile faster


def last_loss_text(rec: dict) -> str:
    """The training loss a run logged last, with its step: "199: 2.926"; "nan" for a loss that is not finite,
    "—" without one."""
    points = rec.get("train_loss") or []
    if not points:
        return "—"
    step, loss = points[-1]
    return f"{int(step)}: " + (num(loss) if math.isfinite(loss) else "nan")


def over_base(run: dict, rec: dict) -> float | None:
    """rec's steady step over the BASE run's in the same process `run`; None for BASE itself or without it."""
    base = next((r for r in run["records"] if r["label"] == BASE), None)
    if base is None or rec["label"] == BASE:
        return None
    return ratio((rec.get("steady") or {}).get(STEP_MS), (base.get("steady") or {}).get(STEP_MS))


def long_rows(runs: list[dict]) -> list[list[str]]:
    """One row per run label, in order of first appearance: processes, exit codes, step ms, tokens/s, reserved and
    allocated peak GiB, the label's step over BASE's (within each process), the last logged step and loss of each
    process ("nan" flags a loss that is not finite)."""
    labels = ordered(rec["label"] for run in runs for rec in run["records"])
    rows = []
    for lab in labels:
        recs = [(run, rec) for run in runs for rec in run["records"] if rec["label"] == lab]
        steady = [rec.get("steady") or {} for _, rec in recs]
        rows.append(
            [
                lab,
                str(len(recs)),
                " ".join(str(rec["exit_code"]) for _, rec in recs),
                cell(Stat.of(s.get(STEP_MS) for s in steady)),
                cell(Stat.of(s.get(TOKENS_S) for s in steady), lambda v: f"{v / 1e3:.0f}k"),
                cell(Stat.of(s.get(RESERVED) for s in steady)),
                cell(Stat.of(s.get(PEAK) for s in steady)),
                cell(Stat.of(over_base(run, rec) for run, rec in recs), times),
                " ".join(last_loss_text(rec) for _, rec in recs),
            ]
        )
    return rows


def long_section(runs: list[dict]) -> str:
    """The section for one series of bench/curves.py runs of configs/long.yaml (same settings in every process)."""
    settings = runs[0]["settings"]
    header = ["run", "processes", "exit codes", "steady step (ms)", "tokens/s", "reserved GiB", "allocated peak GiB"]
    header += [f"step over {BASE}'s", "last logged step: loss, per process"]
    files = ", ".join(run["file"].name for run in runs)
    has_base = any(rec["label"] == BASE for run in runs for rec in run["records"])
    return "\n".join(
        [
            f"## Long context ({settings['config']}, {' '.join(settings.get('train_args') or []) or 'as written'})",
            "",
            f"`{curves_command(settings, runs[0]['records'])}`, {runs_text(runs)} ({files}); "
            f"{environment_text(run['environment'] for run in runs)}. *steady step*, *tokens/s*, memory: the step "
            "timer's medians over the steps after warm-up, then the median [min–max] over processes; *reserved*: "
            "the most memory the allocator held in a step, CUDA graphs' pools included (what bounds a step under "
            "graphs); *allocated peak*: the most the process's tensors held in a step; *step over "
            f"{BASE}'s*: the run's step over the {BASE} run's in the same process, above 1 where {BASE} is faster"
            + ("." if has_base else f" (these processes have no {BASE} run: compare with the series without _seed)."),
            "",
            table(header, long_rows(runs)),
        ]
    )
