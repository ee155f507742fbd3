"""Compile, in parallel processes, every kernel a tuned bench_kernels run will try, before that run times anything.

cuTile's tuning compiles its candidates one after another (compile_tile holds a process-wide lock), and so does
Triton's autotune; both keep what they compile in disk caches that later processes reuse. This script deals the
candidates of every cuTile tune space to JOBS processes (process i launches the i-th, (i + JOBS)-th, ...
configuration of every stage's space at once, through `kernels.cutile.tuning.precompiling`) running the cuTile
forward + cuTile backward at each shape (its two state walks run as --walks says), and runs Triton's forward and
forward + backward once in one more process. Nothing is timed or written to the tuning cache: the timing process
still tunes, from compiled kernels.

    python -m bench.precompile --shapes seed,step --jobs 16       # then bench_kernels.py --autotune ...
    python -m bench.precompile --shapes sweep --modes fwd --no-triton
    python -m bench.precompile --shapes seed --modes fwd_bwd --walks aside   # the backward's other walks
    python -m bench.precompile --shapes step --documents short    # the builds with document boundaries (seq_idx)
    python -m bench.precompile --shapes step --documents stdlib --layers --no-triton   # a training step's layer
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from bench.bench_kernels import MODES, SHAPE_SETS, Shape, make_call, make_inputs
from bench.documents import DOCUMENTS, packed_seq_idx
from bench.results import available_backends
from kernels.cutile.state_walks import DEFAULT_WALKS, WALK_MODES

ROOT = Path(__file__).resolve().parents[1]  # the workers run `python -m bench.precompile` from here


def shapes_of(names: str, documents: str = "none") -> list[Shape]:
    """The shapes of comma-separated bench_kernels shape sets, each once, with `documents` (bench.documents)."""
    unknown = [name for name in names.split(",") if name not in SHAPE_SETS]
    if unknown:
        raise ValueError(f"--shapes: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(SHAPE_SETS)}")
    shapes = dict.fromkeys(
        replace(shape, documents=documents) for name in names.split(",") for shape in SHAPE_SETS[name]
    )
    return list(shapes)


def cutile_call(shape: Shape, mode: str, walks: str) -> Callable[[], object]:
    """The launches of bench_kernels' cutile:cutile call at `shape` in `mode`: the cuTile forward and, with fwd_bwd,
    the cuTile backward's passes on bench_kernels' inputs, its two state walks run as `walks` (WALK_MODES)."""
    from kernels.cutile.ssd import ssd_backward, ssd_forward

    t = make_inputs(shape, "cuda", requires_grad=False)
    args = (t["x"], t["dt"], t["A"], t["B"], t["C"], shape.chunk_size, t["D"], t["dt_bias"], True, None, t["seq_idx"])
    dy = torch.randn_like(t["x"])

    def call() -> None:
        ssd_forward(*args, "cutile")
        if mode == "fwd_bwd":
            ssd_backward(dy, None, *args, walks=walks)

    return call


def block_call(shape: Shape) -> Callable[[], object]:
    """The launches of one Mamba-2 block (model.mamba2.Mamba2Block, expand 2) whose SSD is `shape`, with the cuTile
    conv + SiLU, gated RMSNorm, SSD and SSD backward, forward and backward under bf16 autocast as training runs
    it: the kernels of a training step's layer, at its shapes."""
    from model.mamba2 import Mamba2Block, Mamba2Config

    cfg = Mamba2Config(
        d_model=shape.nheads * shape.headdim // 2,
        d_state=shape.dstate,
        headdim=shape.headdim,
        expand=2,
        ngroups=shape.ngroups,
        chunk_size=shape.chunk_size,
        ssd_backend="cutile",
        ssd_backward="cutile",
        conv_backend="cutile",
        norm_backend="cutile",
    )
    block = Mamba2Block(cfg, layer_idx=0).cuda()
    u = torch.randn(shape.batch, shape.seqlen, cfg.d_model, device="cuda", requires_grad=True)
    seq_idx = packed_seq_idx(shape.documents, shape.batch, shape.seqlen, "cuda")

    def call() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            y = block(u, seq_idx)
        y.float().square().mean().backward()

    return call


def cutile_worker(
    shapes: list[Shape], modes: list[str], worker: int, jobs: int, walks: str, layers: bool = False
) -> None:
    """Launch the worker-th, (worker + jobs)-th, ... candidate of every stage's tune space at each shape (the
    first pass learns the largest space; a stage whose space is shorter runs its default), the backward's walks
    run as `walks`; with `layers`, through a whole block (block_call) instead of the SSD alone in `modes`. A launch
    that fails is reported and skipped, with the stages after it in that call (tuning compiles those itself)."""
    from kernels.cutile import tuning

    for shape in shapes:
        calls = [block_call(shape)] if layers else [cutile_call(shape, mode, walks) for mode in modes]
        k = worker
        while True:
            with tuning.precompiling(k) as sizes:
                for call in calls:
                    try:
                        call()
                    except RuntimeError as e:  # a candidate that does not compile: tuning skips it too
                        print(f"precompile: worker {worker}, candidate {k} at {shape}: {e}", flush=True)
            torch.cuda.synchronize()
            k += jobs
            if k >= max(sizes.values(), default=0):
                break


def triton_worker(shapes: list[Shape], modes: list[str]) -> None:
    for shape in shapes:
        for mode in modes:
            make_call(shape, "triton", mode, "cuda")()
    torch.cuda.synchronize()


def run_workers(commands: dict[str, list[str]], gpus: list[str], timeout: float) -> list[str]:
    """Run each command (worker name -> argv) at once, the i-th on GPU gpus[i % len(gpus)], with its output in a
    file (a full pipe would stall it); print each one's "precompile:" lines as it ends, and the tail of its
    output if it failed. Workers still running `timeout` seconds after the start are killed and count as failed.
    Returns the failed workers' names."""
    start = time.perf_counter()
    failed = []
    with tempfile.TemporaryDirectory(prefix="precompile-") as logs:
        procs = {}
        for i, (w, cmd) in enumerate(commands.items()):
            log = open(Path(logs) / f"{w}.log", "w+")  # closed below, after the worker ends
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}
            procs[w] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT), log)
        deadline = start + timeout
        for done, (w, (proc, log)) in enumerate(procs.items(), 1):
            try:
                proc.wait(timeout=max(deadline - time.perf_counter(), 0))
                status = f"exited {proc.returncode}"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status = "killed after --timeout"
            with log:
                log.seek(0)
                out = log.read()
            for line in out.splitlines():
                if line.startswith("precompile:"):
                    print(line)
            print(f"precompile: worker {w} {status} ({done}/{len(procs)}, {time.perf_counter() - start:.0f} s)")
            if proc.returncode != 0:
                failed.append(w)
                print(out[-3000:], file=sys.stderr)
    return failed


def spawn(args: argparse.Namespace, triton: bool) -> int:
    """The cuTile workers and the Triton one (if `triton`), spread over the visible GPUs."""
    workers = [str(i) for i in range(args.jobs)] + (["triton"] if triton else [])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(torch.cuda.device_count())))
    common = ["--shapes", args.shapes, "--modes", args.modes, "--jobs", str(args.jobs), "--walks", args.walks]
    common += ["--documents", args.documents] + ["--layers"] * args.layers
    start = time.perf_counter()
    commands = {w: [sys.executable, "-m", "bench.precompile", *common, "--worker", w] for w in workers}
    failed = run_workers(commands, visible.split(","), args.timeout)
    print(f"precompile: {len(workers)} processes, {time.perf_counter() - start:.0f} s, failed: {failed or 'none'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--shapes", default="seed,step", help=f"comma-separated bench_kernels shape sets: {', '.join(SHAPE_SETS)}"
    )
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="cuTile processes (default: CPU cores)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before workers still running are killed")
    ap.add_argument("--no-triton", dest="triton", action="store_false", help="skip the Triton process")
    ap.add_argument(
        "--walks",
        default=DEFAULT_WALKS,
        help=f"how the cuTile backward runs its two state walks: {', '.join(WALK_MODES)} (default %(default)s)",
    )
    ap.add_argument(
        "--documents",
        default="none",
        choices=DOCUMENTS,
        help="packed documents (seq_idx) of every shape, as bench_kernels",
    )
    ap.add_argument(
        "--layers",
        action="store_true",
        help="launch a whole Mamba-2 block per shape (its cuTile conv, norm, SSD and their backward, as a training "
        "step does) instead of the SSD alone; --modes and --walks then do not apply",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # set by the parent: an index, or "triton"
    args = ap.parse_args(argv)
    try:
        shapes = shapes_of(args.shapes, args.documents)
    except ValueError as e:
        print(f"precompile: {e}", file=sys.stderr)
        return 2
    modes = args.modes.split(",")
    if any(mode not in MODES for mode in modes):
        print(f"precompile: --modes: choose from {', '.join(MODES)}, got {args.modes!r}", file=sys.stderr)
        return 2
    if args.walks not in WALK_MODES:
        print(f"precompile: --walks: choose from {', '.join(WALK_MODES)}, got {args.walks!r}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"precompile: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("precompile: needs a CUDA GPU (it compiles by launching)", file=sys.stderr)
        return 2
    torch.set_float32_matmul_precision("high")  # as bench_kernels
    if args.worker is None:
        backends, _ = available_backends("cutile,triton" if args.triton else "cutile", "cuda")
        if "cutile" not in backends:
            print("precompile: the cutile backend cannot run here (see above)", file=sys.stderr)
            return 2
        return spawn(args, "triton" in backends)
    if args.worker == "triton":
        triton_worker(shapes, modes)
    else:
        cutile_worker(shapes, modes, int(args.worker), args.jobs, args.walks, args.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
