"""How far rounding the chunk states and their gradients to a low-precision dtype moves an SSD stage's outputs,
in float64 on a CPU: the error a kernel would add by feeding those fp32 operands to its matrix products in
bf16 (or fp16), set against the GPU tests' tolerance for that dtype. No GPU needed.

    python -m bench.operand_rounding                       # bf16 and fp16, chunk/p/n in {64, 128}
    python -m bench.operand_rounding --dtypes bfloat16 --sizes 32

Each stage runs twice on bench.inputs.stage_inputs: once on the exact operands, once on them rounded
(chunk_states for compute_out and bwd_dbc, dstates for bwd_dx and bwd_dbc). Printed per dtype: the largest
norm-wise relative difference of each output over the grid, outputs in the input dtype rounded as the
kernels store them (da_inter, da_intra, ddt, dD stay float32), and beside it the error that rounding the
exact outputs alone already makes.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
from torch import Tensor

from bench.inputs import rel_err, stage_inputs
from kernels import reference
from kernels import reference_backward as ref_bwd

OUTPUTS = {
    "compute_out": ("y",),
    "bwd_dx": ("dx", "ddt_dir", "da_intra", "dD"),
    "bwd_dbc": ("dB", "dC", "da_inter"),
}
STORED = {"y", "dx", "dB", "dC"}  # outputs a kernel stores in the input dtype


def stage_outputs(stage: str, t: dict, states: Tensor, dstates: Tensor) -> tuple[Tensor, ...]:
    """The stage's outputs in float64 from stage_inputs `t`, with the given chunk states and their gradients."""
    f64 = {k: None if v is None else v.double() for k, v in t.items()}
    raw = (f64["x"], f64["dy"], f64["B"], f64["C"], t["dt_out"], t["dA_cumsum"])
    if stage == "compute_out":
        return (reference.compute_out(f64["x"], f64["B"], f64["C"], t["dt_out"], t["dA_cumsum"], states, f64["D"]),)
    if stage == "bwd_dx":
        dx, ddt_dir, da_intra, dD_parts = ref_bwd.bwd_dx(*raw, dstates, f64["D"])
        return dx, ddt_dir, da_intra, dD_parts.sum(1)
    return ref_bwd.bwd_dbc(*raw, states, dstates)


def rounding_errors(dtype: torch.dtype, sizes: list[int]) -> dict[str, tuple[float, float]]:
    """output -> (largest error with rounded operands, largest error of rounding the exact output alone)."""

    def r(v: Tensor) -> Tensor:
        return v.to(dtype).double()

    worst: dict[str, tuple[float, float]] = {}
    for chunk, p, n in itertools.product(sizes, repeat=3):
        t = stage_inputs(dtype, chunk, p, n, g=2, seed=1 + chunk + p + n, device="cpu")
        states, dstates = t["chunk_states"], t["dstates"]
        for stage, names in OUTPUTS.items():
            exact = stage_outputs(stage, t, states, dstates)
            rounded = stage_outputs(stage, t, r(states), r(dstates))
            for name, a, b in zip(names, rounded, exact):
                stored = name in STORED
                err = rel_err(r(a) if stored else a, b)
                floor = rel_err(r(b), b) if stored else 0.0
                old = worst.get(name, (0.0, 0.0))
                worst[name] = (max(old[0], err), max(old[1], floor))
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated low-precision dtypes")
    ap.add_argument("--sizes", default="64,128", help="chunk sizes, head dims and state sizes (every combination)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            print(f"operand_rounding.py: error: unknown dtype {name!r}", file=sys.stderr)
            return 2
        worst = rounding_errors(dtype, sizes)
        figures = ", ".join(f"{k} {e:.1e} (stored alone {f:.1e})" for k, (e, f) in worst.items())
        print(f"{name}: {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
