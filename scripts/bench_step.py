"""The full training step of the Mamba-2 LM per SSD backend, in one process, on the same data.

For each model size and sequence length, one model per backend (same initial weights), AdamW,
bf16 autocast on GPU, gradient clipping: warm-up steps are timed on their own (compilation,
autotuning), then steady-state steps alternate between backends. Per step: total, forward,
backward and optimizer time (CUDA events), the SSD's own forward and backward time inside it
(kernels.timing), tokens/s, peak memory, MFU against the GPU's dense bf16 peak. Optionally the
same under torch.compile.

    python scripts/bench_step.py --out results/step.json
    python scripts/bench_step.py --sizes tiny --seqlens 128 --backends torch --steps 3   # CPU plumbing
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels
from kernels.cutile import tuning
from kernels.timing import Mark
from lightning_modules.flops import peak_tflops, ssd_flops_per_token, train_flops_per_token
from lightning_modules.mamba2 import Mamba2Config, Mamba2LM, next_token_loss
from scripts import benchlib

SIZES = {  # name: (d_model, n_layer); headdim 64, d_state 128, chunk 128, expand 2, vocab 16384
    "20M": (384, 12),
    "130M": (768, 24),
    "tiny": (64, 2),
}


def model_config(size: str) -> Mamba2Config:
    d_model, n_layer = SIZES[size]
    if size == "tiny":
        return Mamba2Config(vocab_size=512, d_model=d_model, n_layer=n_layer, d_state=16, headdim=16, chunk_size=32)
    return Mamba2Config(vocab_size=16384, d_model=d_model, n_layer=n_layer, d_state=128, headdim=64, chunk_size=128)


class Runner:
    """One model + optimizer for one backend; `step` runs and times one training step."""

    def __init__(self, cfg: Mamba2Config, backend: str, device: str, compile_model: bool):
        torch.manual_seed(0)
        self.model = Mamba2LM(cfg).to(device)
        self.model.backend = backend
        self.forward = torch.compile(self.model) if compile_model else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)  # as in training (foreach, not fused)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def step(self, tokens: torch.Tensor) -> dict[str, float]:
        kernels.ssd_timer.reset()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = Mark(self.device)
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = next_token_loss(self.forward, tokens)
        t1 = Mark(self.device)
        loss.backward()
        t2 = Mark(self.device)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        t3 = Mark(self.device)
        t3.synchronize()
        ssd_fwd, ssd_bwd = kernels.ssd_timer.totals_ms()
        out = {
            "step_ms": t0.ms_until(t3),
            "forward_ms": t0.ms_until(t1),
            "backward_ms": t1.ms_until(t2),
            "optimizer_ms": t2.ms_until(t3),
            "ssd_forward_ms": ssd_fwd,
            "ssd_backward_ms": ssd_bwd,
            "loss": float(loss),
        }
        if self.cuda:
            out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return out


def bench(size: str, seqlen: int, batch: int, backends: list[str], compile_model: bool, args, device: str):
    cfg = model_config(size)
    cfg.chunk_size = min(cfg.chunk_size, seqlen)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (batch, seqlen + 1), generator=gen).to(device) for _ in range(4)]
    # The timer marks are not traced by torch.compile: SSD times are measured in eager mode only.
    kernels.ssd_timer.enabled = not compile_model
    runners, warmup = {}, {}
    for backend in backends:
        runner = Runner(cfg, backend, device, compile_model)
        start = time.perf_counter()
        for i in range(args.warmup):
            runner.step(batches[i % len(batches)])
        warmup[backend] = time.perf_counter() - start
        runners[backend] = runner
    samples: dict[str, list[dict]] = {b: [] for b in backends}
    for i in range(args.steps):
        for backend in backends:  # alternate, so drift affects every backend alike
            samples[backend].append(runners[backend].step(batches[i % len(batches)]))
    peak = peak_tflops(torch.cuda.get_device_name()) if device == "cuda" else None
    tokens = batch * seqlen
    records = []
    for backend in backends:
        med = {k: statistics.median(s[k] for s in samples[backend]) for k in samples[backend][0]}
        spread = benchlib.summarize([s["step_ms"] for s in samples[backend]])
        tok_s = tokens / (med["step_ms"] / 1e3)
        rec = {
            "size": size,
            "parameters": runners[backend].model.num_parameters(),
            "config": {k: v for k, v in vars(cfg).items()},
            "seqlen": seqlen,
            "batch": batch,
            "backend": backend,
            "mode": "compile" if compile_model else "eager",
            "median": med,
            "step_ms_spread": spread,
            "tokens_per_s": tok_s,
            "mfu": train_flops_per_token(cfg) * tok_s / (peak * 1e12) if peak else None,
            "ssd_share": (med["ssd_forward_ms"] + med["ssd_backward_ms"]) / med["step_ms"],
            "ssd_flops_share": ssd_flops_per_token(cfg) * cfg.n_layer / (train_flops_per_token(cfg) / 3),
            "warmup_s": warmup[backend],
            "warmup_steps": args.warmup,
        }
        records.append(rec)
        print(
            f"{size:5s} L={seqlen:6d} {rec['mode']:7s} {backend:7s} step {med['step_ms']:8.2f} ms "
            f"(fwd {med['forward_ms']:.2f} bwd {med['backward_ms']:.2f} opt {med['optimizer_ms']:.2f}; "
            f"ssd fwd {med['ssd_forward_ms']:.2f} bwd {med['ssd_backward_ms']:.2f}) {tok_s:,.0f} tok/s "
            f"mfu {rec['mfu'] or 0:.3f} peak {med.get('peak_gib', 0):.1f} GiB warm-up {warmup[backend]:.1f} s",
            flush=True,
        )
    del runners
    if device == "cuda":
        torch.cuda.empty_cache()
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/step.json")
    ap.add_argument("--sizes", default="20M,130M")
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--tokens_per_step", type=int, default=16384, help="batch = tokens_per_step // seqlen")
    ap.add_argument("--backends", default="cutile,triton,torch")
    ap.add_argument("--modes", default="eager", help="eager, compile, or both: eager,compile")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--autotune", action="store_true", help="tune cuTile block sizes (cached on disk)")
    args = ap.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tuning.set_autotune(args.autotune)
    backends, skipped = benchlib.available_backends(args.backends, device)
    if not backends:
        print("no backend can run here", file=sys.stderr)
        return 2
    records: list[dict] = []
    payload = {
        "kind": "bench_step",
        "environment": benchlib.environment(),
        "settings": {**vars(args), "device": device, "skipped": skipped},
        "records": records,
    }
    for mode in args.modes.split(","):
        for size in args.sizes.split(","):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                batch = max(1, args.tokens_per_step // seqlen)
                try:
                    records += bench(size, seqlen, batch, backends, mode == "compile", args, device)
                except Exception as e:  # keep what was measured; say what failed
                    print(f"FAILED {size} L={seqlen} {mode}: {type(e).__name__}: {e}", flush=True)
                    records.append({"size": size, "seqlen": seqlen, "mode": mode, "error": f"{type(e).__name__}: {e}"})
                benchlib.write_json(args.out, payload)  # after every shape: a timeout keeps what was measured
    print(f"wrote {benchlib.write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
