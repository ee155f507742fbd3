"""Hardware counters of the SSD's kernels: one forward + backward call of a backend under Nsight Compute (ncu), so a
kernel's distance from its memory floor comes with what its warps wait on.

    python scripts/ncu_ssd.py --shape seed --variants cutile:cutile,triton --out results/ncu   # needs ncu and a GPU
    python scripts/ncu_ssd.py --summary results/ncu/seed_cutile-cutile.csv                    # re-print a summary

For each variant (as bench_kernels.py names them) the script runs itself under ncu: the variant warms up, then runs
one call between cudaProfilerStart and cudaProfilerStop, the only kernels ncu profiles (an NVTX range would miss the
backward: autograd launches it from its own thread). The cuTile kernels take the machine's tuning cache, else their
defaults. With --autotune the script first runs the variant once without ncu, which tunes what the cache lacks
(tuning keeps its choices on disk; under ncu every launch is slowed, so it would choose on wrong times), and the run
under ncu then finds every choice cached. ncu keeps
the clocks as it finds them (--clock-control none). Each variant's report (OUT/SHAPE_VARIANT.ncu-rep) is exported to
CSV beside it (ncu's raw page, one row per kernel, cut to the columns below), and a table prints per kernel:
duration; DRAM bytes read and written; DRAM, L2 and SM throughput in % of peak; achieved occupancy; registers per
thread; and the three stall reasons with the most warps waiting per issued instruction ("selected" and
"not_selected", an issuing or an eligible warp, are not waits and are left out).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from lightning_modules.measure.kernel_names import short_name

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis")
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
STALL = re.compile(r"smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio")
NOT_WAITING = ("selected", "not_selected")  # reasons ncu counts that are not a wait: issuing, or eligible
KERNEL = ("ID", "Kernel Name", "Block Size", "Grid Size")  # the columns kept beside the metrics
COLUMNS = {  # table column -> raw metric
    "us": "gpu__time_duration.sum",
    "DRAM rd MB": "dram__bytes_read.sum",
    "DRAM wr MB": "dram__bytes_write.sum",
    "DRAM %": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "L2 %": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "SM %": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occ %": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "regs": "launch__registers_per_thread",
}


def number(value: str) -> float | None:
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return None


def scaled(value: float, unit: str) -> float:
    """A raw metric in the table's unit: durations in us, bytes in MB."""
    factors = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
    factors.update({"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0})
    return value * factors.get(unit, 1.0)


def summarize(csv_path: Path) -> str:
    """The per-kernel table of a raw-page CSV that ncu exported (row 1 metric names, row 2 units, then kernels)."""
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        return f"{csv_path}: no kernels profiled"
    names, units, kernels = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(names)}
    stalls = [
        (r, i) for i, name in enumerate(names) if (m := STALL.fullmatch(name)) and (r := m.group(1)) not in NOT_WAITING
    ]
    lines = ["kernel".ljust(48) + "".join(h.rjust(11) for h in COLUMNS) + "  top stalls (warps per issue)"]
    for row in kernels:
        name = short_name(row[col["Kernel Name"]])[:47] if "Kernel Name" in col else "?"  # as BENCHMARKS.md names it
        cells = []
        for metric in COLUMNS.values():
            v = number(row[col[metric]]) if metric in col else None
            cells.append("-".rjust(11) if v is None else f"{scaled(v, units[col[metric]]):11.1f}")
        waits = sorted(((number(row[i]) or 0.0, reason) for reason, i in stalls), reverse=True)[:3]
        lines.append(name.ljust(48) + "".join(cells) + "  " + ", ".join(f"{r} {v:.1f}" for v, r in waits))
    return "\n".join(lines)


def trim(text: str) -> str:
    """An exported raw page (several hundred columns) cut to the columns `summarize` reads."""
    rows = list(csv.reader(text.splitlines()))
    keep = [i for i, name in enumerate(rows[0]) if name in KERNEL or name in COLUMNS.values() or STALL.fullmatch(name)]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([[row[i] for i in keep] for row in rows])
    return out.getvalue()


def measured_call(shape_name: str, variant: str, autotune: bool) -> None:
    """Inside ncu: tune and warm the variant up, then one call with the profiler started."""
    import torch

    from kernels.cutile import tuning
    from scripts.bench_kernels import SHAPE_SETS, make_call

    tuning.set_autotune(autotune)
    (shape,) = SHAPE_SETS[shape_name]
    call = make_call(shape, variant, "fwd_bwd", "cuda")
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def profile(shape: str, variant: str, out: Path, autotune: bool) -> Path:
    """Run one variant under ncu; returns the exported CSV (the columns the table reads; the report itself, every
    section, stays beside it as OUT/SHAPE_VARIANT.ncu-rep)."""
    stem = out / f"{shape}_{variant.replace(':', '-')}"
    command = ["ncu", "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off"]
    for section in SECTIONS:
        command += ["--section", section]
    command += ["--metrics", ",".join(METRICS), "--export", str(stem), "--force-overwrite"]
    inner = [sys.executable, __file__, "--inner", "--shape", shape, "--variants", variant]
    inner += ["--autotune"] if autotune else []
    if autotune:
        subprocess.run(inner, check=True)
    subprocess.run(command + inner, check=True)
    exported = subprocess.run(
        ["ncu", "--import", f"{stem}.ncu-rep", "--page", "raw", "--csv", "--print-units", "base"],
        check=True,
        capture_output=True,
        text=True,
    )
    csv_path = stem.with_suffix(".csv")
    csv_path.write_text(trim(exported.stdout))
    return csv_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="seed", choices=("seed", "step"))
    ap.add_argument(
        "--variants", default="cutile:cutile,triton", help="comma-separated, as bench_kernels.py names them"
    )
    ap.add_argument("--out", default="results/ncu", help="folder for the reports and CSVs")
    ap.add_argument("--autotune", action="store_true", help="tune the cuTile kernels before the measured call")
    ap.add_argument("--summary", metavar="CSV", help="print the table of an exported CSV and exit")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.summary:
        print(summarize(Path(args.summary)))
        return 0
    variants = args.variants.split(",")
    if args.inner:
        measured_call(args.shape, variants[0], args.autotune)
        return 0
    if shutil.which("ncu") is None:
        print("ncu_ssd: ncu (Nsight Compute) is not on PATH", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[1])  # the inner runs import kernels and scripts from here
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    for variant in variants:
        csv_path = profile(args.shape, variant, out, args.autotune)
        print(f"\n{args.shape}, {variant} ({csv_path}):\n{summarize(csv_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
