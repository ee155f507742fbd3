"""Record mamba_ssm's Triton autotune choices at the shipped configs' shapes, for kernels/triton_tuned.json.

Runs a training step (forward and backward, bf16 autocast) and a no-grad forward of each config's model with the
triton SSD backend, starting from no choices (the shipped ones are dropped first), then writes what the
autotuners chose as this GPU's entry of the table (kernels.triton_choices). Needs a CUDA GPU and mamba_ssm.

    python -m bench.triton_table --configs medium,small,tiny            # writes kernels/triton_tuned.json
    python -m bench.triton_table --configs medium --out /tmp/table.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import yaml

from bench.bench_step import CONFIGS, load_module
from bench.step import token_batches
from kernels import triton_choices
from model.mamba2 import next_token_loss


def run_config(name: str, device: torch.device) -> float:
    """One training step and one no-grad forward of configs/<name>.yaml's model on the triton backend: seconds."""
    data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["data"]
    seqlen, batch = data["seq_len"], data["batch_size"]
    module = load_module(name, "triton", seqlen, compile_model=False, compile_mode=None).to(device)
    tokens = token_batches(module.config.vocab_size, batch, seqlen, 0, device, count=1)[0]
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        next_token_loss(module.model, tokens).backward()
        with torch.no_grad():
            next_token_loss(module.model, tokens)
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="medium,small,tiny", help="names of configs/*.yaml, comma-separated")
    ap.add_argument("--out", type=Path, default=triton_choices.SHIPPED, help="the table to write this GPU's entry to")
    args = ap.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    missing = [n for n in names if not (CONFIGS / f"{n}.yaml").is_file()]
    if missing:
        ap.error(f"no config {', '.join(missing)} in {CONFIGS}")
    if not torch.cuda.is_available():
        ap.error("recording Triton's choices needs a CUDA GPU")
    from kernels import triton_backend  # needs mamba_ssm

    device = torch.device("cuda", torch.cuda.current_device())
    tuners = triton_backend.autotuners()
    triton_backend.use_shipped_choices(device.index)  # done once per process: dropped below, so nothing is copied
    for tuner in tuners.values():
        tuner.cache.clear()
    for name in names:
        print(f"{name}: tuned in {run_config(name, device):.1f} s", flush=True)
    gpu = torch.cuda.get_device_name(device)
    kernels = triton_choices.recorded(tuners)
    triton_choices.write(args.out, gpu, triton_backend.versions(), kernels)
    print(f"{sum(map(len, kernels.values()))} choices of {len(kernels)} kernels for {gpu} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
