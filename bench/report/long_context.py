"""Long context (bench/curves.py on configs/long.yaml): one section, a row per series (a GPU and a sequence length)
and SSD variant: its steady step, tokens/s, memory and the loss it ended at, pooled over the series' processes as
median [min–max], and each variant's step over the cuTile variant's, taken within each process before pooling."""

from __future__ import annotations

import math

from bench.report.boundaries import environment_text
from bench.report.curves import STEP_MS, TOKENS_S, curves_command
from bench.report.format import Stat, cell, num, ordered, ratio, table, times
from bench.report.series import device_name, devices, measured_args

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


def long_rows(name: str, runs: list[dict]) -> list[list[str]]:
    """One row per run label of the series `name`, in order of first appearance: the series, its GPU, train.py arguments
    (measured_args) and steps on the first row, then processes, exit codes, step ms, tokens/s, reserved GiB, the
    label's step over BASE's (within each process), the last logged step and loss of each process ("nan" flags a
    loss that is not finite)."""
    settings = runs[0]["settings"]
    args = " ".join(measured_args(settings.get("train_args"))) or "as written"
    where = [name, devices(runs).removeprefix("NVIDIA "), args, str(settings["steps"])]
    labels = ordered(rec["label"] for run in runs for rec in run["records"])
    rows = []
    for lab in labels:
        recs = [(run, rec) for run in runs for rec in run["records"] if rec["label"] == lab]
        steady = [rec.get("steady") or {} for _, rec in recs]
        rows.append(
            [
                *(where if not rows else [""] * len(where)),  # the series' own cells on its first row only
                lab,
                str(len(recs)),
                " ".join(str(rec["exit_code"]) for _, rec in recs),
                cell(Stat.of(s.get(STEP_MS) for s in steady)),
                cell(Stat.of(s.get(TOKENS_S) for s in steady), lambda v: f"{v / 1e3:.0f}k"),
                cell(Stat.of(s.get(RESERVED) for s in steady)),
                cell(Stat.of(over_base(run, rec) for run, rec in recs), times),
                " ".join(last_loss_text(rec) for _, rec in recs),
            ]
        )
    return rows


def long_section(series: dict[str, list[dict]]) -> str:
    """One section for every series (name -> its runs) of bench/curves.py on configs/long.yaml (each series: one
    GPU, the same settings in every process), a table row per series and run label."""
    header = ["series", "GPU", "train.py arguments", "steps", "run", "processes", "exit codes", "steady step (ms)"]
    header += ["tokens/s", "reserved GiB", f"step over {BASE}'s", "last logged step: loss, per process"]
    runs = [run for one in series.values() for run in one]
    peaks = Stat.of((rec.get("steady") or {}).get(PEAK) for run in runs for rec in run["records"])
    gpus = ordered(device_name(run) for run in runs)
    envs = [environment_text(run["environment"] for run in runs if device_name(run) == gpu) for gpu in gpus]
    example = runs[0]
    shown = {**example["settings"], "train_args": measured_args(example["settings"].get("train_args"))}
    return "\n".join(
        [
            "## Long context (configs/long.yaml through train.py: bench/curves.py)",
            "",
            f"`{curves_command(shown, example['records'])}` writes a series' first process "
            "(NAME.json; processes 2 and 3: NAME_run2.json, NAME_run3.json); each series has its own steps, runs and "
            "train.py arguments (bench/headline.sh long and long_seed). *steady step*, *tokens/s*, *reserved*: the "
            "step timer's medians over the steps after warm-up, then the median [min–max] over a series' "
            "processes; *reserved*: the most memory the allocator held in a step, CUDA graphs' pools included (what "
            f"bounds a step under graphs; the process's tensors alone peaked at {cell(peaks)} GiB); *step over "
            f"{BASE}'s*: the run's step over the {BASE} run's in the same process, above 1 where {BASE} is faster "
            "(a _seed series has no cutile run: compare with the series without _seed).",
            "",
            *(f"- {env}" for env in envs),
            "",
            table(header, [row for name, one in series.items() for row in long_rows(name, one)]),
        ]
    )
