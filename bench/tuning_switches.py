"""The benchmarks' switches for cuTile's tuning tables (bench_kernels, bench_step, bench_scaling)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from kernels.cutile import tuning


def add_table_arguments(ap: argparse.ArgumentParser) -> None:
    """Adds --tuning_cache, --shipped_table and --sweep to `ap` (which must also have --autotune)."""
    ap.add_argument(
        "--tuning_cache",
        default=None,
        help="the JSON file cuTile's tuning results are read from and written to; default: the user's cache "
        "(~/.cache/mamba2-cutile/tuning.json)",
    )
    ap.add_argument(
        "--shipped_table",
        default=None,
        help="the table of tuned cuTile configurations read after the cache (default: kernels/cutile/tuned.json); "
        "'none': no table (the untuned defaults, or with --autotune a search of every shape the cache lacks)",
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="search every shape afresh, each configuration's time printed (stderr): --autotune, no shipped table, "
        "a temporary cache unless --tuning_cache names one",
    )


def apply_table_arguments(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Points cuTile's tuning at the tables `args` name; with --sweep, also sets args.autotune and makes tuning print
    every configuration it times. A --sweep that contradicts --no-autotune or a named table is `ap`'s error."""
    if args.sweep:
        if args.autotune is False or args.shipped_table not in (None, "none"):
            ap.error("--sweep searches with no shipped table: it takes neither --no-autotune nor --shipped_table")
        args.autotune, args.shipped_table = True, "none"
        if args.tuning_cache is None:
            args.tuning_cache = str(Path(tempfile.mkdtemp(prefix="mamba2-cutile-sweep-")) / "tuning.json")
    point_tuning(args)


def point_tuning(args: argparse.Namespace) -> None:
    """Points this process's cuTile tuning at the tables of `args` (spawned processes call it again)."""
    if args.sweep:
        tuning.sweep_verbosely()
    tuning.set_cache_path(args.tuning_cache)
    tuning.set_shipped_path(os.devnull if args.shipped_table == "none" else args.shipped_table)
