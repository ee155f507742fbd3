"""Probe the cuTile causal conv + SiLU or gated RMSNorm: the production kernels and variant files of them, each
checked against the PyTorch layer in float64, then timed side by side (GPU time per kernel, torch.profiler) at
one layer of the medium model's training step: b 8, l 2048 (configs/medium.yaml). The conv runs over 1792
channels with k 4 on a strided view of a (b, l, 3352) in_proj output, as the model passes it; the norm over
1536 channels in one group, gated by a strided view of the same output.

    python -m bench.probe_layer conv                                        # the production kernels alone
    python -m bench.probe_layer conv /tmp/causal_conv_v2.py --sweep         # tune each file, every config printed
    python -m bench.probe_layer norm /tmp/rms_norm_v2.py
    python -m bench.probe_layer conv /tmp/causal_conv_v2.py --documents stdlib   # packed documents (seq_idx)

A variant file is a changed copy of kernels/cutile/causal_conv.py or kernels/cutile/rms_norm.py. It is loaded
without its torch.library registrations, so that the op names keep the production module's functions; the
probe calls the host functions, conv_fwd and conv_bwd or norm_fwd and norm_bwd. Each file gets its own tuning
cache, so with --sweep each is tuned afresh and without it each launches its defaults. Tuning runs at the step's
shape alone: the float64 check, at a small shape with partial tiles, runs the configurations the timing ran.
--documents (the conv only) times it on documents packed as bench_step's (bench.documents), and checks it on
documents of CHECK_LENGTHS tokens (one-token documents, boundaries next to each other and far apart).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import torch

import kernels
from bench.documents import DOCUMENTS, packed, packed_seq_idx
from bench.inputs import rel_err
from bench.timing import gpu_kernel_ms
from bench.variants import load_variant
from kernels.cutile import tuning
from model.layers import causal_conv1d_silu, rms_norm

LAYERS = {"conv": "causal_conv", "norm": "rms_norm"}  # layer -> its module in kernels/cutile
KERNELS = {"conv": ("conv_fwd", "conv_bwd", "conv_bwd_dx"), "norm": ("norm_fwd", "norm_bwd")}  # their tuning names
B, L, D_INNER, D_STATE, HEADS, K = 8, 2048, 1536, 128, 24, 4  # one layer of configs/medium.yaml's step
CHANNELS = D_INNER + 2 * D_STATE  # the conv's: x, B and C
WIDTH = 2 * D_INNER + 2 * D_STATE + HEADS  # in_proj's output: z, x, B, C, dt
EPS = 1e-5
DTYPES = (torch.bfloat16, torch.float32)  # the float64 check's
CHECK_LENGTHS = (1, 3, 1, 2, 40, 7, 1, 60)  # the float64 check's documents, packed in a cycle (--documents)


def load(layer: str, path: str | None) -> types.ModuleType:
    """The production module of `layer`, or a variant file of it without its torch.library registrations (the
    source from its first custom op on is left out)."""
    name = LAYERS[layer]
    if path is None:
        return importlib.import_module(f"kernels.cutile.{name}")
    return load_variant(path, until="@torch.library.custom_op")


def check_seq_idx(b: int, l: int, device: str) -> torch.Tensor:
    """seq_idx (b, l) int32 of CHECK_LENGTHS's documents packed in a cycle, each row counting from 0."""
    return packed(list(CHECK_LENGTHS) * (1 + b * l // sum(CHECK_LENGTHS)), b, l, device)


def inputs(layer: str, dtype: torch.dtype, b: int, l: int, seed: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    """The layer's inputs and an upstream gradient, as the model lays them out (views of in_proj's output); the
    conv's seq_idx is None (passes and max_error take the documents)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=g) * scale).to(dtype)

    zxbcdt = randn(b, l, WIDTH)
    if layer == "conv":
        x = zxbcdt[..., D_INNER : D_INNER + CHANNELS]
        weight = torch.randn(CHANNELS, K, device=device, generator=g) * 0.5
        bias = torch.randn(CHANNELS, device=device, generator=g) * 0.1
        return {"x": x, "weight": weight, "bias": bias, "dy": randn(b, l, CHANNELS), "seq_idx": None}
    z = zxbcdt[..., :D_INNER]
    weight = 1.0 + 0.1 * torch.randn(D_INNER, device=device, generator=g)
    return {"x": randn(b, l, D_INNER), "z": z, "weight": weight, "dy": randn(b, l, D_INNER)}


def passes(layer: str, module: types.ModuleType, t: dict) -> tuple[Callable, Callable]:
    """(forward, backward) host calls of `module` on inputs t; the backward's saved tensors come from one forward."""
    if layer == "conv":
        return (
            lambda: module.conv_fwd(t["x"], t["weight"], t["bias"], t["seq_idx"]),
            lambda: module.conv_bwd(t["dy"], t["x"], t["weight"], t["bias"], t["seq_idx"]),
        )
    _, rstd = module.norm_fwd(t["x"], t["weight"], EPS, t["z"], D_INNER, t["x"].dtype)
    return (
        lambda: module.norm_fwd(t["x"], t["weight"], EPS, t["z"], D_INNER, t["x"].dtype),
        lambda: module.norm_bwd(t["dy"], t["x"], t["weight"], t["z"], rstd, D_INNER),
    )


def max_error(
    layer: str, module: types.ModuleType, dtype: torch.dtype, device: str = "cuda", documents: bool = False
) -> float:
    """The largest relative error of the output and every gradient against autograd through the PyTorch layer in
    float64, at a small shape with a partial tile (b 2, l 133); documents: the conv on check_seq_idx's."""
    t = inputs(layer, dtype, 2, 133, seed=7, device=device)
    if documents:
        t["seq_idx"] = check_seq_idx(2, 133, device)
    forward, backward = passes(layer, module, t)
    got = [forward(), *backward()]
    got[0] = got[0][0] if layer == "norm" else got[0]  # norm_fwd returns (out, rstd)
    exact = {k: v.detach().double().requires_grad_() for k, v in t.items() if k not in ("dy", "seq_idx")}
    if layer == "conv":
        want = causal_conv1d_silu(exact["x"], exact["weight"], exact["bias"], t["seq_idx"])
        wrt = [exact["x"], exact["weight"], exact["bias"]]
    else:
        want = rms_norm(exact["x"], exact["weight"], EPS, exact["z"], D_INNER)
        wrt = [exact["x"], exact["z"], exact["weight"]]
    grads = torch.autograd.grad(want, wrt, t["dy"].double())
    return max(rel_err(a, w) for a, w in zip(got, [want, *grads], strict=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("layer", choices=sorted(LAYERS))
    ap.add_argument("variants", nargs="*", help=f"changed copies of kernels/cutile/{{{','.join(LAYERS.values())}}}.py")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="tune each file, printing every configuration's time")
    ap.add_argument("--documents", choices=DOCUMENTS, default="none", help="the conv on packed documents (seq_idx)")
    args = ap.parse_args(argv)
    if args.layer != "conv" and args.documents != "none":
        print(f"probe_layer: --documents takes the conv only (the {args.layer} has no seq_idx)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("probe_layer needs a CUDA GPU", file=sys.stderr)
        return 2
    print(
        f"kernels.cutile.{LAYERS[args.layer]}, b {B} l {L}, bf16, documents {args.documents}"
        " (errors: bf16 and fp32 against float64)",
        flush=True,
    )
    documents = args.documents != "none"
    scratch = Path(tempfile.mkdtemp(prefix="probe_layer_"))
    if args.sweep:
        tuning.sweep_verbosely()
    for i, path in enumerate([None, *args.variants]):
        module = load(args.layer, path)
        tuning.set_cache_path(scratch / f"tuning{i}.json")  # a fresh cache per file: nothing reused across files
        t = inputs(args.layer, torch.bfloat16, B, L, seed=0)
        if documents:
            t["seq_idx"] = packed_seq_idx(args.documents, B, L, "cuda")
        forward, backward = passes(args.layer, module, t)
        with contextlib.ExitStack() as stack:  # compile and, with --sweep, tune; note what each kernel launched
            launched = {name: stack.enter_context(tuning.forced(name)) for name in KERNELS[args.layer]}
            forward(), backward()
        times = {name: gpu_kernel_ms(fn, args.calls) for name, fn in (("fwd", forward), ("bwd", backward))}
        chosen = "; ".join(f"{k.split('|')[0]} {v['config']}" for k, v in kernels.tuning_choices().items())
        with contextlib.ExitStack() as stack:  # the errors of the configurations timed, not tuned again
            for name, configs in launched.items():
                stack.enter_context(tuning.forced(name, configs[0]))
            errors = {dtype: max_error(args.layer, module, dtype, documents=documents) for dtype in DTYPES}
        print(
            f"{path or 'production':34s} fwd {times['fwd']['ms'] * 1e3:7.1f} us  bwd {times['bwd']['ms'] * 1e3:7.1f} us"
            f"  rel err bf16 {errors[torch.bfloat16]:.1e} fp32 {errors[torch.float32]:.1e}  {chosen}",
            flush=True,
        )
        for name, res in times.items():
            for kernel, ms in res["by_kernel"].items():
                print(f"    {name} {ms * 1e3:7.1f} us x{res['launches'][kernel]:.0f}  {kernel[:90]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
