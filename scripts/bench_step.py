"""The full training step of the Mamba-2 LM per SSD backend, in one process, on the same data.

Models come from the training configs (configs/<name>.yaml: its model section, data.vocab_size), one
per backend with the same initial weights, built as train.py builds them (LanguageModel: its
optimizer, its compile setting unless --modes says otherwise), bf16 autocast on a GPU, gradient
clipping. Warm-up steps are timed on their own (compilation, autotuning), then steady-state steps
alternate between backends. Per step (lightning_modules.measure.step): total, forward, backward and
optimizer time, the SSD's own forward and backward time inside it (eager only), tokens/s, peak
memory, MFU against the GPU's dense bf16 peak. Marks are read after the timed steps, so measuring
does not synchronize the steps it measures.

    python scripts/bench_step.py --out results/step.json
    python scripts/bench_step.py --configs tiny --seqlens 64 --tokens_per_step 128 --backends torch --steps 2
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

import kernels
from lightning_modules.language_model import LanguageModel
from lightning_modules.measure.environment import available_backends, environment, peak_tflops
from lightning_modules.measure.results import write_json
from lightning_modules.measure.step import TimedStep
from lightning_modules.measure.timing import summarize
from lightning_modules.model.flops import ssd_flops_per_token, train_flops_per_token
from lightning_modules.model.mamba2 import Mamba2Config, next_token_loss

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def load_module(name: str, backend: str, seqlen: int, compile_model: bool) -> LanguageModel:
    """LanguageModel as configs/<name>.yaml builds it, with this SSD backend and compile setting.

    The chunk is capped at the sequence length (tiny CPU shapes).
    """
    path = CONFIGS / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(
            f"no config {path}; choose from {', '.join(p.stem for p in sorted(CONFIGS.glob('*.yaml')))}"
        )
    experiment = yaml.safe_load(path.read_text())
    settings = dict(experiment["model"])
    cfg = Mamba2Config(**settings.pop("config"), vocab_size=experiment["data"]["vocab_size"])
    cfg = dataclasses.replace(cfg, ssd_backend=backend, chunk_size=min(cfg.chunk_size, seqlen))
    return LanguageModel(config=cfg, **{**settings, "compile": compile_model})


def bench(name: str, seqlen: int, batch: int, backends: list[str], compile_model: bool, args, device: str):
    torch.manual_seed(0)
    runs = {}
    for backend in backends:
        torch.manual_seed(0)  # same initial weights for every backend
        module = load_module(name, backend, seqlen, compile_model).to(device)
        step = TimedStep(
            lambda tokens, m=module.model: next_token_loss(m, tokens),
            list(module.parameters()),
            module.optimizer(),
            device,
        )
        runs[backend] = (module, step)
    cfg = runs[backends[0]][0].config
    if args.autotune is not None:
        kernels.set_autotune(args.autotune)
    else:
        kernels.set_autotune(runs[backends[0]][0].hparams.cutile_autotune)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (batch, seqlen + 1), generator=gen).to(device) for _ in range(4)]
    # The SSD's own marks are not traced by torch.compile: SSD times are measured in eager mode only.
    kernels.ssd_timer.enabled = not compile_model
    warmup = {}
    for backend, (_, step) in runs.items():
        start = time.perf_counter()
        for i in range(args.warmup):
            step(batches[i % len(batches)], timed=False)
        if device == "cuda":
            torch.cuda.synchronize()
        warmup[backend] = time.perf_counter() - start
    marks: dict[str, list] = {b: [] for b in backends}
    for i in range(args.steps):
        for backend in backends:  # alternate, so drift affects every backend alike
            marks[backend].append(runs[backend][1](batches[i % len(batches)]))
    kernels.ssd_timer.enabled = False
    peak = peak_tflops(torch.cuda.get_device_name()) if device == "cuda" else None
    tokens = batch * seqlen
    records = []
    for backend in backends:
        samples = [m.read() for m in marks[backend]]
        med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        tok_s = tokens / (med["step_ms"] / 1e3)
        rec = {
            "size": name,
            "parameters": runs[backend][0].model.num_parameters(),
            "config": dataclasses.asdict(cfg) | {"ssd_backend": backend},
            "seqlen": seqlen,
            "batch": batch,
            "backend": backend,
            "mode": "compile" if compile_model else "eager",
            "median": med,
            "step_ms_spread": summarize([s["step_ms"] for s in samples]),
            "tokens_per_s": tok_s,
            "mfu": train_flops_per_token(cfg) * tok_s / (peak * 1e12) if peak else None,
            "ssd_share": (med["ssd_forward_ms"] + med["ssd_backward_ms"]) / med["step_ms"],
            "ssd_flops_share": ssd_flops_per_token(cfg) * cfg.n_layer / (train_flops_per_token(cfg) / 3),
            "warmup_s": warmup[backend],
            "warmup_steps": args.warmup,
        }
        records.append(rec)
        print(
            f"{name:6s} L={seqlen:6d} {rec['mode']:7s} {backend:7s} step {med['step_ms']:8.2f} ms "
            f"(fwd {med['forward_ms']:.2f} bwd {med['backward_ms']:.2f} opt {med['optimizer_ms']:.2f}; "
            f"ssd fwd {med['ssd_forward_ms']:.2f} bwd {med['ssd_backward_ms']:.2f}) {tok_s:,.0f} tok/s "
            f"mfu {rec['mfu'] or 0:.3f} peak {med.get('peak_gib', 0):.1f} GiB warm-up {warmup[backend]:.1f} s",
            flush=True,
        )
    del runs
    if device == "cuda":
        torch.cuda.empty_cache()
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/step.json")
    ap.add_argument("--configs", default="small,medium", help="names of configs/*.yaml (their model sections)")
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--tokens_per_step", type=int, default=16384, help="batch = tokens_per_step // seqlen")
    ap.add_argument("--backends", default="cutile,triton,torch")
    ap.add_argument("--modes", default="eager", help="eager, compile, or both: eager,compile")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument(
        "--autotune",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tune cuTile block sizes (cached on disk); default: the config's model.cutile_autotune",
    )
    args = ap.parse_args(argv)

    torch.set_float32_matmul_precision("high")  # as train.py: float32 matmuls may use TF32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backends, skipped = available_backends(args.backends, device)
    if not backends:
        print("no backend can run here", file=sys.stderr)
        return 2
    records: list[dict] = []
    payload = {
        "kind": "bench_step",
        "environment": environment(),
        "settings": {**vars(args), "device": device, "skipped": skipped},
        "records": records,
    }
    for mode in args.modes.split(","):
        for name in args.configs.split(","):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                batch = max(1, args.tokens_per_step // seqlen)
                try:
                    records += bench(name, seqlen, batch, backends, mode == "compile", args, device)
                except Exception as e:  # keep what was measured; say what failed
                    print(f"FAILED {name} L={seqlen} {mode}: {type(e).__name__}: {e}", flush=True)
                    records.append({"size": name, "seqlen": seqlen, "mode": mode, "error": f"{type(e).__name__}: {e}"})
                write_json(args.out, payload)  # after every shape: a timeout keeps what was measured
    print(f"wrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
