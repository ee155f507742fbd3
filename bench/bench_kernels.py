"""The SSD alone: cutile vs triton vs torch, forward and forward+backward, in one process.

For each shape, backends are timed alternately (repeat r of every backend before repeat r + 1 of
any), after a warm-up that is timed on its own (first-call compilation and autotuning). Reported
per backend: wall time per call (CUDA events, launch gaps included) with median and spread over
repeats, GPU time per call (torch.profiler; kernels running at once on two streams count once),
achieved GB/s over the SSD's minimal traffic and TFLOP/s of the chunked algorithm, against ceilings
measured in the same run. With both modes, each shape ends with every variant's backward on GPU time
(forward + backward less its backend's forward, the same process) and Triton's over it.

    python -m bench.bench_kernels --out results/kernels.json            # seed shape + sweep
    python -m bench.bench_kernels --shapes seed,step --autotune         # seed, and one layer of the medium step
    python -m bench.bench_kernels --shapes seed --modes fwd_bwd --sweep # every cuTile configuration's time, stderr
    python -m bench.bench_kernels --shapes seed --shipped_table none    # the untuned defaults
    python -m bench.bench_kernels --shapes tiny --backends torch        # plumbing check on CPU
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

import kernels
from bench.documents import DOCUMENTS, packed_seq_idx
from bench.inputs import random_inputs
from bench.kernel_names import by_listed_name
from bench.results import available_backends, backward_records, write_json
from bench.timing import ceilings, gpu_kernel_ms, summarize, wall_ms
from bench.traffic import SSDShape, ssd_io
from bench.tuning_switches import add_table_arguments, apply_table_arguments
from lightning_modules.environment import environment


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    dstate: int
    ngroups: int = 1
    chunk_size: int = 128
    dtype: str = "bfloat16"
    documents: str = "none"  # packed documents (seq_idx) of bench.documents: none, stdlib, short

    def bytes_moved(self) -> int:
        """Each input read once and y written once: x, B, C, y in dtype; dt in float32; A, D, dt_bias."""
        return ssd_io(SSDShape.of(asdict(self))).total

    def flops(self) -> int:
        """Forward FLOPs of the chunked algorithm with full Q x Q blocks: C Bᵀ, (scores) x, chunk states, C S."""
        b, l, h, p, n, q = self.batch, self.seqlen, self.nheads, self.headdim, self.dstate, self.chunk_size
        return 2 * b * l * h * (q * n + q * p + 2 * p * n)


SEED = Shape(4, 16384, 8, 64, 128)
STEP = Shape(8, 2048, 24, 64, 128)  # one layer's SSD in the medium model's step (configs/medium.yaml, batch 8)
STEP_L8192 = Shape(2, 8192, 24, 64, 128)  # the same at L 8192, batch 2 (bench/headline.sh step_l8192)
# L 2048-16384 x state 64 and 128 x head dim 64 and 128 (8 heads, batch 4)
SWEEP = [Shape(4, l, 8, p, n) for p in (64, 128) for n in (64, 128) for l in (2048, 4096, 8192, 16384)]
TINY = [Shape(1, 96, 2, 16, 8, chunk_size=32, dtype="float32")]
TOP_KERNELS = 16  # kernels per record whose GPU times are kept (a cuTile forward + backward launches 10 kinds)
SHAPE_SETS = {"seed": [SEED], "step": [STEP], "step_l8192": [STEP_L8192], "sweep": SWEEP, "tiny": TINY}
SHAPE_SETS |= {f"sweep_n{n}": [s for s in SWEEP if s.dstate == n] for n in (64, 128)}  # its halves, one call each
MODES = ("fwd", "fwd_bwd")  # the forward alone (no autograd), forward + backward (gradients of every input)


def make_inputs(shape: Shape, device: str, requires_grad: bool) -> dict[str, torch.Tensor]:
    b, l, h, p, g, n = shape.batch, shape.seqlen, shape.nheads, shape.headdim, shape.ngroups, shape.dstate
    dtype = getattr(torch, shape.dtype)
    inputs = random_inputs(b, l, h, p, g, n, dtype, seed=0, device=device, dt_dtype=torch.float32)
    inputs = {k: v for k, v in inputs.items() if v is not None}
    if requires_grad:
        for t in inputs.values():
            t.requires_grad_(True)
    return inputs | {"seq_idx": packed_seq_idx(shape.documents, b, l, device)}


def split(variant: str) -> tuple[str, str]:
    """ "cutile:cutile" -> ("cutile", "cutile"): backend and backward; a plain name has the reference backward."""
    backend, _, backward = variant.partition(":")
    return backend, backward or "reference"


def forward_variants(variants: list[str]) -> list[str]:
    """The forward's variants: one per backend, named without its backward ("cutile:cutile" and "cutile" share
    one forward, timed once as "cutile", also when only "cutile:cutile" was asked for)."""
    return list(dict.fromkeys(split(v)[0] for v in variants))


def make_call(shape: Shape, variant: str, mode: str, device: str):
    backend, backward = split(variant)
    inputs = make_inputs(shape, device, requires_grad=mode == "fwd_bwd")
    grad_y = None

    def forward():
        return kernels.ssd(
            inputs["x"],
            inputs["dt"],
            inputs["A"],
            inputs["B"],
            inputs["C"],
            shape.chunk_size,
            D=inputs["D"],
            dt_bias=inputs["dt_bias"],
            dt_softplus=True,
            seq_idx=inputs["seq_idx"],
            backend=backend,
            backward=backward,
        )

    if mode == "fwd":

        def call():
            with torch.no_grad():
                return forward()

        return call

    leaves = [t for t in inputs.values() if t is not None and t.requires_grad]

    def call():
        nonlocal grad_y
        y = forward()
        if grad_y is None:
            grad_y = torch.randn_like(y)
        return torch.autograd.grad(y, leaves, grad_y)

    return call


def bench_shape(shape: Shape, variants: list[str], modes: list[str], repeats: int, calls: int, device: str):
    records = []
    for mode in modes:
        fns, warmup = {}, {}
        backends_here = forward_variants(variants) if mode == "fwd" else variants
        for backend in backends_here:
            fn = make_call(shape, backend, mode, device)
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            warmup[backend] = time.perf_counter() - start
            for _ in range(2):
                fn()
            fns[backend] = fn
        samples = {b: [] for b in backends_here}
        for _ in range(repeats):
            for backend in backends_here:  # alternate: drift hits every backend alike
                samples[backend].append(wall_ms(fns[backend], calls))
        for backend in backends_here:
            prof = gpu_kernel_ms(fns[backend], min(calls, 5))
            gpu_ms, launches = prof["ms"], prof["kernels"]
            listed_ms, listed_launches = by_listed_name(prof["by_kernel"], prof["launches"])
            measured = math.isfinite(gpu_ms)  # off GPU there is no kernel time: null in the JSON (JSON has no NaN)
            wall = summarize(samples[backend])
            rec = {
                "shape": asdict(shape),
                "mode": mode,
                "backend": split(backend)[0],
                "backward": split(backend)[1],
                "wall_ms": wall,
                "gpu_ms": gpu_ms if measured else None,
                "gpu_kernel_sum_ms": prof["kernel_sum_ms"] if measured else None,  # above gpu_ms: streams overlapped
                "kernels_per_call": launches,
                "top_kernels_ms": (top := dict(list(listed_ms.items())[:TOP_KERNELS])),
                # launches per call of the listed kernels launched other than once (the rest: once)
                "kernel_launches": {name: n for name in top if (n := listed_launches[name]) != 1},
                "warmup_s": warmup[backend],
                "GBps_gpu": shape.bytes_moved() / gpu_ms / 1e6 if measured else None,
                "TFLOPs_gpu": (shape.flops() * (1 if mode == "fwd" else 3)) / gpu_ms / 1e9 if measured else None,
            }
            records.append(rec)
            print(
                f"L={shape.seqlen:6d} n={shape.dstate:3d} {mode:7s} {backend:13s} wall {wall['median']:8.3f} ms "
                f"(iqr {wall['iqr']:.3f})  gpu {gpu_ms:8.3f} ms  {launches:3d} kernels  warm-up {warmup[backend]:.1f} s",
                flush=True,
            )
        del fns
        if device == "cuda":
            torch.cuda.empty_cache()
    for variant, bwd_ms, over_triton in backward_shares(records):
        ratio = "" if over_triton is None else f"  over triton {over_triton:.3f}x"
        print(f"L={shape.seqlen:6d} n={shape.dstate:3d} bwd     {variant:13s} gpu {bwd_ms:8.3f} ms{ratio}", flush=True)
    return records


def backward_shares(records: list[dict]) -> list[tuple[str, float, float | None]]:
    """Each variant's backward on GPU time (`backward_records`: forward + backward less its backend's forward) from
    one shape's records of one process, with Triton's over it where Triton ran both modes (above 1: faster)."""
    rows = [
        (r["backend"] if r["backward"] == "reference" else f"{r['backend']}:{r['backward']}", r["gpu_ms"])
        for r in backward_records(records)
        if r["gpu_ms"] is not None
    ]
    triton = dict(rows).get("triton")
    return [(name, ms, None if triton is None or name == "triton" else triton / ms) for name, ms in rows]


def fail(message: str) -> int:
    """One line on stderr; exit code 2 (bad input: nothing was measured)."""
    print(f"bench_kernels.py: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/kernels.json", help="JSON file to write")
    ap.add_argument(
        "--shapes",
        default="sweep",
        help=f"comma-separated sets of shapes: {', '.join(SHAPE_SETS)} "
        "(step, step_l8192: one layer of the medium model's step at L 2048, 8192)",
    )
    ap.add_argument(
        "--backends",
        default="cutile,cutile:cutile,triton,torch",
        help="comma-separated; NAME:BACKWARD picks the cutile backward (cutile:cutile); unavailable ones are skipped",
    )
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    ap.add_argument("--chunk", type=int, default=None, help="chunk size for every shape (default: each shape's, 128)")
    ap.add_argument(
        "--documents",
        default="none",
        choices=DOCUMENTS,
        help="packed documents (seq_idx) of every shape: bench.documents",
    )
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--calls", type=int, default=20, help="calls per timed repeat")
    ap.add_argument(
        "--autotune", action="store_true", default=None, help="tune cuTile block sizes per shape (cached on disk)"
    )
    add_table_arguments(ap)
    args = ap.parse_args(argv)
    apply_table_arguments(ap, args)
    names = [name.strip() for name in args.shapes.split(",")]
    modes = list(dict.fromkeys(mode.strip() for mode in args.modes.split(",")))
    for option, given, known in (("--shapes", names, SHAPE_SETS), ("--modes", modes, MODES)):
        unknown = [name for name in given if name not in known]
        if unknown:
            return fail(f"{option}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")

    torch.set_float32_matmul_precision("high")  # as train.py: float32 matmuls may use TF32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kernels.set_autotune(bool(args.autotune))
    shapes = list(dict.fromkeys(shape for name in names for shape in SHAPE_SETS[name]))
    if args.chunk is not None:
        shapes = [replace(shape, chunk_size=args.chunk) for shape in shapes]
    shapes = [replace(shape, documents=args.documents) for shape in shapes]
    variants = args.backends.split(",")
    backends, skipped = available_backends(",".join(dict.fromkeys(split(v)[0] for v in variants)), device)
    variants = [v for v in variants if split(v)[0] in backends]
    if not variants:
        return fail(f"no backend of --backends {args.backends} can run here")
    env = environment()
    print(env, flush=True)
    base = {
        "kind": "bench_kernels",
        "environment": env,
        "ceilings": ceilings(),
        "settings": {**vars(args), "device": device, "skipped": skipped},
    }
    records = []
    for i, shape in enumerate(shapes, 1):
        records += bench_shape(shape, variants, modes, args.repeats, args.calls, device)
        # written after every shape, so that a run stopped part-way keeps what it measured
        path = write_json(args.out, {**base, "records": records, "tuning": kernels.tuning_choices()})
        print(f"shape {i}/{len(shapes)} done: wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
