"""Data-parallel scaling of the training step, 1 to N GPUs with the same per-GPU batch, per SSD variant.

One process per GPU, spawned here (on a machine without GPUs: processes on the CPU, gloo, for a plumbing
run). Each variant's model is built as bench_step builds it (bench.bench_step.load_module: configs/<name>.yaml
as train.py builds it, the same initial weights, fused AdamW, gradient clipping, bf16 autocast on a GPU,
compiled in place when the mode is `compile`). After timed warm-up, every process times three steps on its
own batches, alternating step by step so that drift hits each alike (each timed step after an untimed one of
its own, bench.step.alternate):

    single    the plain model, no communication: the 1-GPU step (every rank times its own, at the same time)
    ddp       the model in DistributedDataParallel (Lightning's settings: 25 MB buckets, built on the current
              stream): the N-GPU step; its backward includes whatever gradient all-reduce did not overlap
    no_sync   the same DDP model inside ddp.no_sync(): DDP's step without the all-reduce

and times one all-reduce of a buffer holding every gradient (what DDP reduces per step, in buckets). Then

    scaling_efficiency = single step / slowest rank's ddp step   (N-GPU tokens/s over N x 1-GPU tokens/s)
    exposed_comm_ms    = ddp step - no_sync step                 (the all-reduce time the step waits for)
    overlap            = 1 - exposed_comm_ms / allreduce_ms      (the share of it hidden behind the backward)

Each phase keeps the step split of bench.step (forward, backward, optimizer, the SSD's own
forward and backward in eager mode) per rank. With `compile` the model is compiled in place as train.py compiles
it and first traced inside DDP's forward (the DDP phase warms up first), as under train.py: dynamo's DDPOptimizer
then splits the graph at DDP's buckets so that their all-reduce can start during the backward; the overlap figure
says how much of it does. `--ddp_init_stream side` builds DDP as Lightning 2.6's own DDPStrategy does (on a new
side stream): the records then count the "AccumulateGrad node's stream" warnings and show what the mismatch costs.
`--devices 1` times the single phase only. The JSON is written by rank 0 after every variant.

    python -m bench.bench_scaling --quick --devices 2 --modes eager --out results/scaling.json
    python -m bench.bench_scaling --config tiny --seqlen 64 --batch 2 --devices 2 --device cpu --backends torch
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import os
import socket
import statistics
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from torch.nn.parallel import DistributedDataParallel

import kernels
from bench.bench_step import (  # models built as bench_step builds them
    CONFIGS,
    VARIANTS,
    compile_mode,
    load_module,
    parse_run_arguments,
)
from bench.results import available_backends, write_json
from bench.step import TimedStep, alternate, median_split, token_batches, warm_up
from bench.timing import gpu_kernel_ms, summarize
from bench.tuning_switches import point_tuning
from kernels.timing import Mark
from lightning_modules.environment import environment, peak_tflops
from lightning_modules.strategies import STREAM_WARNING
from model.flops import train_flops_per_token
from model.mamba2 import next_token_loss

PHASES = ("single", "ddp", "no_sync")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _allreduce_ms(numel: int, device: torch.device, repeats: int) -> dict[str, float]:
    """One all-reduce of `numel` float32 values (every gradient at once), median over `repeats`."""
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    dist.all_reduce(buf)  # warm-up: the communicator's first call sets up its channels
    samples = []
    for _ in range(repeats):
        start = Mark(device)
        dist.all_reduce(buf)
        end = Mark(device)
        end.synchronize()
        samples.append(start.ms_until(end))
    ms = statistics.median(samples)
    n, nbytes = dist.get_world_size(), numel * 4
    return {"bytes": nbytes, "ms": ms, "busbw_GBps": 2 * (n - 1) / n * nbytes / (ms / 1e3) / 1e9}


def _gather(obj):
    """Every rank's `obj`, in rank order ([obj] without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def bench_variant(name: str, label: str, compile_model: bool, args, rank: int, world: int, device: torch.device):
    """This rank's figures for one variant: {phase: [split per step]}, warm-up seconds, all-reduce, warnings."""
    module = load_module(name, label, args.seqlen, compile_model, compile_mode(name, args)).to(device)
    model = module.model
    params = list(model.parameters())
    optimizer = module.optimizer(fused=True)  # as training under bf16-mixed or fp32: see LanguageModel
    single = TimedStep(lambda tokens: next_token_loss(model, tokens), params, optimizer, device)
    steps = {}
    if world > 1:
        side = args.ddp_init_stream == "side" and device.type == "cuda"  # as Lightning 2.6's DDPStrategy
        with torch.cuda.stream(torch.cuda.Stream(device)) if side else contextlib.nullcontext():
            ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        synced = TimedStep(lambda tokens: next_token_loss(ddp, tokens), params, optimizer, device)

        def unsynced(tokens: torch.Tensor, timed: bool = True):
            with ddp.no_sync():
                return synced(tokens, timed)

        steps["ddp"], steps["no_sync"] = synced, unsynced  # first: a compiled model is traced inside DDP
    steps["single"] = single
    kernels.set_autotune(module.hparams.cutile_autotune if args.autotune is None else args.autotune)
    # each rank its own batches, as under a DistributedSampler
    batches = token_batches(module.config.vocab_size, args.batch, args.seqlen, 1000 * rank, device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warmup = warm_up(steps, batches, args.warmup, device)  # compilation and autotuning, timed apart
        kernels.ssd_timer.enabled = not compile_model  # compiled graphs carry no SSD marks
        try:
            _, marks = alternate(steps, batches, args.steps, device)
        finally:
            kernels.ssd_timer.enabled = False
        seen = [str(w.message) for w in caught]
    out = {
        "phases": {phase: [m.read() for m in ms] for phase, ms in marks.items()},
        "warmup_s": warmup,
        "stream_warnings": sum(STREAM_WARNING in s for s in seen),
        "parameters": module.model.num_parameters(),
        "config": dataclasses.asdict(module.config),
        "train_flops_per_token": train_flops_per_token(module.config),
    }
    if world > 1:
        out["allreduce"] = _allreduce_ms(sum(p.numel() for p in params), device, max(3, args.steps))
        if args.profile and device.type == "cuda":
            prof = gpu_kernel_ms(lambda: steps["ddp"](batches[0], timed=False), 2)
            out["profile"] = {
                "gpu_ms": prof["ms"],
                "nccl_ms": sum(ms for k, ms in prof["by_kernel"].items() if "nccl" in k.lower()),
                "top_kernels_ms": dict(list(prof["by_kernel"].items())[:15]),
            }
    return out


def summarize_variant(name: str, label: str, mode: str, per_rank: list[dict], args, device: torch.device) -> dict:
    """The record of one variant from every rank's figures."""
    world = len(per_rank)
    tokens = args.batch * args.seqlen  # per GPU and step
    cfg = per_rank[0]["config"]
    flops = per_rank[0]["train_flops_per_token"]
    peak = peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    record = {
        "size": name,
        "parameters": per_rank[0]["parameters"],
        "config": cfg,
        "seqlen": args.seqlen,
        "batch_per_gpu": args.batch,
        "world_size": world,
        "variant": label,
        "backend": VARIANTS[label][0],
        "backward": VARIANTS[label][1],
        "mode": mode,
        "train_flops_per_token": flops,
        "warmup_s": {phase: max(r["warmup_s"][phase] for r in per_rank) for phase in per_rank[0]["warmup_s"]},
        "stream_warnings": sum(r["stream_warnings"] for r in per_rank),
        "phases": {},
    }
    for phase in per_rank[0]["phases"]:
        medians = [median_split(r["phases"][phase]) for r in per_rank]
        step_ms = [m["step_ms"] for m in medians]
        gpus = 1 if phase == "single" else world  # single: every rank is its own 1-GPU run
        slowest = statistics.median(step_ms) if phase == "single" else max(step_ms)
        tok_s = gpus * tokens / (slowest / 1e3)
        record["phases"][phase] = {
            "median": medians[0],
            "per_rank": medians,
            "step_ms": slowest,
            "step_ms_spread": summarize([s["step_ms"] for r in per_rank for s in r["phases"][phase]]),
            "tokens_per_s": tok_s,
            "mfu": flops * tok_s / (peak * 1e12 * gpus) if peak else None,
            "ssd_share": (medians[0]["ssd_forward_ms"] + medians[0]["ssd_backward_ms"]) / medians[0]["step_ms"],
        }
    if world > 1:
        single, ddp, unsynced = (record["phases"][p]["step_ms"] for p in PHASES)
        allreduce = per_rank[0]["allreduce"]
        record["allreduce"] = {**allreduce, "ms_per_rank": [r["allreduce"]["ms"] for r in per_rank]}
        record["scaling_efficiency"] = single / ddp
        record["speedup"] = world * single / ddp
        record["exposed_comm_ms"] = ddp - unsynced
        record["overlap"] = 1 - record["exposed_comm_ms"] / allreduce["ms"]
        record["ddp_overhead_ms"] = unsynced - single  # DDP's own hooks and bucket copies, without communication
        if "profile" in per_rank[0]:
            record["profile"] = [r["profile"] for r in per_rank]
    return record


def _print(record: dict) -> None:
    head = f"{record['size']:6s} L={record['seqlen']} b/gpu={record['batch_per_gpu']} {record['mode']:7s} "
    head += f"{record['variant']:10s}"
    for phase, p in record["phases"].items():
        m = p["median"]
        print(
            f"{head} {phase:7s} step {p['step_ms']:8.2f} ms (rank 0: fwd {m['forward_ms']:.2f} bwd "
            f"{m['backward_ms']:.2f} opt {m['optimizer_ms']:.2f}; ranks {[round(r['step_ms'], 2) for r in p['per_rank']]})"
            f" {p['tokens_per_s']:,.0f} tok/s",
            flush=True,
        )
    if "scaling_efficiency" in record:
        a = record["allreduce"]
        print(
            f"{head} efficiency {record['scaling_efficiency']:.3f} (speedup {record['speedup']:.2f}x); all-reduce "
            f"{a['bytes'] / 2**20:.0f} MiB {a['ms']:.2f} ms ({a['busbw_GBps']:.0f} GB/s bus), exposed "
            f"{record['exposed_comm_ms']:.2f} ms, overlap {record['overlap']:.0%}, DDP hooks "
            f"{record['ddp_overhead_ms']:.2f} ms; stream warnings {record['stream_warnings']}",
            flush=True,
        )


def worker(rank: int, world: int, port: int | None, args) -> None:
    """One process: all variants and modes; rank 0 gathers and writes the JSON."""
    use_cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        # A rank that fails while the others wait in a collective would hang them; past the timeout the
        # collective fails instead and the job ends, keeping the JSON written after each finished variant.
        timeout = datetime.timedelta(seconds=args.collective_timeout)
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world, timeout=timeout)
        point_tuning(args)  # a spawned process starts from tuning's defaults
    torch.set_float32_matmul_precision("high")  # as train.py: float32 matmuls may use TF32
    torch._dynamo.config.cache_size_limit = 64  # one compiled graph per variant and mode in this process
    wanted = args.backends.split(",")
    with contextlib.redirect_stdout(io.StringIO()) if rank else contextlib.nullcontext():  # rank 0 says what it skips
        runnable, skipped = available_backends(",".join(sorted({VARIANTS[b][0] for b in wanted})), str(device))
    labels = [b for b in wanted if VARIANTS[b][0] in runnable]
    records: list[dict] = []
    payload = {
        "kind": "bench_scaling",
        "environment": environment() if rank == 0 else None,
        "settings": {
            **vars(args),
            "world_size": world,
            "skipped": skipped,
            "variants": labels,
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
        },
        "records": records,
    }
    for mode in args.modes.split(","):
        for label in labels:
            try:
                mine = bench_variant(args.config, label, mode == "compile", args, rank, world, device)
            except Exception as e:  # keep what was measured; say what failed (every rank reports)
                mine = {"error": f"rank {rank}: {type(e).__name__}: {e}"}
            everyone = _gather(mine)
            errors = [r["error"] for r in everyone if "error" in r]
            if rank == 0:
                if errors:
                    print(f"FAILED {label} {mode}: {'; '.join(errors)}", flush=True)
                    records.append({"variant": label, "mode": mode, "error": "; ".join(errors)})
                else:
                    records.append(summarize_variant(args.config, label, mode, everyone, args, device))
                    _print(records[-1])
                write_json(args.out, payload)  # after every variant: a timeout keeps what was measured
            torch._dynamo.reset()
            if use_cuda:
                torch.cuda.empty_cache()
    if rank == 0:
        print(f"wrote {write_json(args.out, payload)}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/scaling.json")
    ap.add_argument("--config", default="medium", help="name of configs/*.yaml (medium: 103M parameters)")
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU and step (bench_step: 16384 tokens)")
    ap.add_argument("--backends", default="cutile,cutile_bwd,triton,torch", help="variants: cutile, cutile_bwd, ...")
    ap.add_argument("--modes", default=None, help="eager, compile, or eager,compile; default: the config's compile")
    ap.add_argument("--devices", type=int, default=None, help="processes (GPUs); default: every visible GPU, or 1")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="cpu: gloo processes")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="--warmup 2 --steps 4")
    ap.add_argument("--compile_mode", default=None, help="torch.compile mode for `compile` (bench_step's meaning)")
    ap.add_argument("--ddp_init_stream", choices=("current", "side"), default="current")
    ap.add_argument("--profile", action="store_true", help="GPU kernels of one DDP step, NCCL's time among them")
    ap.add_argument(
        "--collective_timeout",
        type=float,
        default=300.0,
        help="seconds a rank waits in a collective before the job fails (compilation included)",
    )
    args = parse_run_arguments(ap, argv)
    unknown = [b for b in args.backends.split(",") if b not in VARIANTS or b == "standin"]
    if unknown or args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.seqlen < 2:
        ap.error(f"unknown variants {unknown} (choose from {', '.join(VARIANTS)} but standin), or a count < 1")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.devices is None:
        args.devices = torch.cuda.device_count() if args.device == "cuda" else 1
    if args.device == "cuda" and args.devices > torch.cuda.device_count():
        ap.error(f"--devices {args.devices}, but torch sees {torch.cuda.device_count()} GPU(s)")
    path = CONFIGS / f"{args.config}.yaml"
    if not path.is_file():
        ap.error(f"no config {path}; choose from {', '.join(p.stem for p in sorted(CONFIGS.glob('*.yaml')))}")
    if args.modes is None:
        args.modes = "compile" if yaml.safe_load(path.read_text())["model"].get("compile") else "eager"
    if set(args.modes.split(",")) - {"eager", "compile"}:
        ap.error(f"--modes takes eager, compile or both, got {args.modes!r}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (shared hosts), inherited by the workers
    if args.devices == 1:
        worker(0, 1, None, args)
    else:
        mp.spawn(worker, args=(args.devices, _free_port(), args), nprocs=args.devices, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
