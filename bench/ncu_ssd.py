"""Hardware counters of the SSD's kernels: one forward + backward call of a backend under Nsight Compute (ncu), so a
kernel's distance from its memory floor comes with what its warps wait on.

    python -m bench.ncu_ssd --shape seed --variants cutile:cutile,triton --out results/ncu   # needs ncu and a GPU
    python -m bench.ncu_ssd --summary results/ncu/seed_cutile-cutile.csv                    # re-print a summary
    python -m bench.ncu_ssd --source "fwd_pass_state|compute_out" --mode fwd --variants cutile --out OUT
    python -m bench.ncu_ssd --source-summary OUT/seed_cutile_source.csv   # re-print the stalls per instruction

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

With --source REGEX only the kernels whose names match are profiled, with ncu's warp-state sampling added
(SourceCounters), and their SASS with the samples at each instruction is exported too (OUT/SHAPE_VARIANT_source.csv,
ncu's source page): the summary then names the instructions the warps were found waiting at most, and the share of
samples each kind of instruction (its opcode) holds.
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

from bench.kernel_names import short_name

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


SAMPLES = "Warp Stall Sampling (All Samples)"  # the source page's column of samples per instruction


def source_summary(text: str, top: int = 25) -> str:
    """The instructions with the most warp-state samples in an exported source page (one table a kernel, each
    starting at a header row that names SAMPLES), then the share of samples per opcode."""
    lines: list[str] = []
    found = False
    header: list[str] | None = None
    rows: list[list[str]] = []

    def flush() -> None:
        if header is None or not rows:
            return
        i_src, i_n = header.index("Source"), header.index(SAMPLES)
        counted = [(number(r[i_n]) or 0.0, r[i_src].strip()) for r in rows if len(r) > max(i_src, i_n)]
        total = sum(n for n, _ in counted) or 1.0
        lines.append(f"{len(counted)} instructions, {total:.0f} samples; the {top} with most:")
        for n, src in sorted(counted, key=lambda c: c[0], reverse=True)[:top]:
            lines.append(f"  {100 * n / total:5.1f}%  {src}")
        by_op: dict[str, float] = {}
        for n, src in counted:
            words = src.split() or ["?"]
            op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]  # past the predicate
            by_op[op] = by_op.get(op, 0.0) + n
        ranked = sorted(by_op.items(), key=lambda kv: kv[1], reverse=True)[:12]
        lines.append("  by opcode: " + ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in ranked))

    for row in csv.reader(text.splitlines()):
        if SAMPLES in row and "Source" in row:
            flush()
            header, rows, found = row, [], True
        elif header is not None and row:
            rows.append(row)
        elif header is None and row:
            lines.append(" ".join(row))  # what ncu prints before a table (the kernel's name)
    flush()
    if not found:  # an export that failed leaves ncu's message in the file
        return "\n".join(["no source table with warp-state samples found:", *text.splitlines()[:5]])
    return "\n".join(lines)


def measured_call(shape_name: str, variant: str, autotune: bool, mode: str = "fwd_bwd") -> None:
    """Inside ncu: tune and warm the variant up, then one call with the profiler started."""
    import torch

    from bench.bench_kernels import SHAPE_SETS, make_call
    from kernels.cutile import tuning

    tuning.set_autotune(autotune)
    (shape,) = SHAPE_SETS[shape_name]
    call = make_call(shape, variant, mode, "cuda")
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def source_path(csv_path: Path) -> Path:
    """Where `profile` writes the source page beside a variant's exported CSV."""
    return csv_path.with_name(f"{csv_path.stem}_source.csv")


def profile(shape: str, variant: str, out: Path, autotune: bool, mode: str, source: str | None) -> Path:
    """Run one variant under ncu; returns the exported CSV (the columns the table reads; the report itself, every
    section, stays beside it as OUT/SHAPE_VARIANT.ncu-rep). With `source`, a regex of kernel names: only those
    kernels, with warp-state sampling, and their source page exported beside (OUT/SHAPE_VARIANT_source.csv)."""
    stem = out / f"{shape}_{variant.replace(':', '-')}"
    command = ["ncu", "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off"]
    for section in SECTIONS + (("SourceCounters",) if source else ()):
        command += ["--section", section]
    if source:
        command += ["--kernel-name", f"regex:{source}"]
    command += ["--metrics", ",".join(METRICS), "--export", str(stem), "--force-overwrite"]
    inner = [sys.executable, "-m", "bench.ncu_ssd", "--inner", "--shape", shape, "--variants", variant, "--mode", mode]
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
    if source:
        page = ["ncu", "--import", f"{stem}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"]
        done = subprocess.run(page, capture_output=True, text=True)
        source_path(csv_path).write_text(done.stdout if done.returncode == 0 else done.stderr)
    return csv_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="seed", choices=("seed", "step"))
    ap.add_argument(
        "--variants", default="cutile:cutile,triton", help="comma-separated, as bench_kernels.py names them"
    )
    ap.add_argument("--out", default="results/ncu", help="folder for the reports and CSVs")
    ap.add_argument("--autotune", action="store_true", help="tune the cuTile kernels before the measured call")
    ap.add_argument("--mode", default="fwd_bwd", choices=("fwd", "fwd_bwd"), help="the call profiled")
    ap.add_argument("--source", metavar="REGEX", help="only these kernels, with their stalls per instruction")
    ap.add_argument("--summary", metavar="CSV", help="print the table of an exported CSV and exit")
    ap.add_argument("--source-summary", metavar="CSV", help="print the stalls of an exported source page and exit")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.summary:
        print(summarize(Path(args.summary)))
        return 0
    if args.source_summary:
        print(source_summary(Path(args.source_summary).read_text()))
        return 0
    variants = args.variants.split(",")
    if args.inner:
        measured_call(args.shape, variants[0], args.autotune, args.mode)
        return 0
    if shutil.which("ncu") is None:
        print("ncu_ssd: ncu (Nsight Compute) is not on PATH", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[1])  # the inner runs import kernels and bench from here
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    for variant in variants:
        csv_path = profile(args.shape, variant, out, args.autotune, args.mode, args.source)
        print(f"\n{args.shape}, {variant} ({csv_path}):\n{summarize(csv_path)}")
        if args.source:
            print(f"\n{source_path(csv_path)}:\n{source_summary(source_path(csv_path).read_text())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
