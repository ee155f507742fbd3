"""What a user of train.py waits for and then gets: the time to the first step with empty caches, then the steady
step, per SSD variant, each in its own train.py process.

For each variant (BACKEND:BACKWARD): one run of one step with every cache pointed at a new folder (cuTile's
compiled kernels, its tuning, Inductor's and Triton's caches: a fresh machine but for the data cache), timed from
the process's start to its exit, reading the step timer's `first_step_s`; then a run of `--steps` steps on the
caches the first filled, reading the step timer's steady-state medians (step_times.json). One process per run,
so a figure is one process's; run the tool three times for a median.

    python -m bench.first_step --config configs/medium.yaml --variants cutile:cutile,cutile:reference,triton:reference
    python -m bench.first_step --config configs/tiny.yaml --variants torch:reference --steps 8 -- --model.compile=false

Arguments after `--` go to every train.py run. Writes JSON (bench.results.write_json) with the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import write_json
from lightning_modules.environment import environment

ROOT = Path(__file__).resolve().parents[1]
CACHES = ("XDG_CACHE_HOME", "CUDA_TILE_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def train(args: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int, float]:
    """Run train.py with `args` from the repository root: (exit code, wall seconds), its output in `log`."""
    start = time.perf_counter()
    with log.open("w") as out:
        try:
            code = subprocess.run(
                [sys.executable, "train.py", *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.perf_counter() - start


def measure(variant: str, config: str, steps: int, extra: list[str], work: Path, timeout: float) -> dict:
    """The record of one variant: its first-step run and its steady run (see the module's docstring)."""
    backend, backward = variant.split(":")
    caches = work / "caches"
    env = {**os.environ, **{name: str(caches / name.lower()) for name in CACHES}}
    common = ["--config", config, f"--model.config.ssd_backend={backend}", f"--model.config.ssd_backward={backward}"]
    common += ["--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false", *extra]
    record: dict = {"variant": variant}
    for phase, max_steps in (("first", 1), ("steady", steps)):
        root = work / phase
        code, wall = train(
            [*common, f"--trainer.max_steps={max_steps}", f"--trainer.default_root_dir={root}"],
            env,
            work / f"{phase}.log",
            timeout,
        )
        summary = root / "step_times.json"
        record[phase] = {
            "exit_code": code,
            "process_s": wall,
            **(json.loads(summary.read_text()) if summary.exists() else {}),
        }
        print(f"first_step: {variant} {phase}: exit {code} in {wall:.1f} s", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(
        prog="python -m bench.first_step", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default="configs/medium.yaml", help="train.py's --config")
    ap.add_argument(
        "--variants", default="cutile:cutile,cutile:reference,triton:reference", help="BACKEND:BACKWARD,..."
    )
    ap.add_argument("--steps", type=int, default=60, help="steps of the steady run")
    ap.add_argument("--timeout", type=float, default=600, help="seconds each train.py run may take")
    ap.add_argument("--out", default="results/first_step.json")
    ap.add_argument(
        "--work", type=Path, help="keep each variant's runs, logs and caches in WORK/<variant> (default: removed)"
    )
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    variants = args.variants.split(",")
    if any(v.count(":") != 1 for v in variants):
        ap.error(f"--variants: each is BACKEND:BACKWARD, got {args.variants!r}")
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    records = []
    for variant in variants:
        if args.work is not None:
            work = args.work / variant.replace(":", "-")
            work.mkdir(parents=True, exist_ok=True)
            records.append(measure(variant, args.config, args.steps, extra, work, args.timeout))
            continue
        with tempfile.TemporaryDirectory(prefix="first_step-") as work:
            records.append(measure(variant, args.config, args.steps, extra, Path(work), args.timeout))
    settings = {"config": args.config, "steps": args.steps, "train_args": extra}
    write_json(args.out, {"kind": "first_step", "settings": settings, "environment": environment(), "records": records})
    print(f"first_step: wrote {args.out}")
    return 0 if all(r[p]["exit_code"] == 0 for r in records for p in ("first", "steady")) else 1


if __name__ == "__main__":
    sys.exit(main())
