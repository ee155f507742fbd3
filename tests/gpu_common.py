"""Shared by the GPU tests: the skip marker, tolerances, the backend call (the error measure: bench.inputs.rel_err)."""

from __future__ import annotations

import pytest
import torch

import kernels

CUTILE = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        kernels.unavailable_reason("cutile", "cuda") is not None,
        reason=f"cutile backend unavailable: {kernels.unavailable_reason('cutile', 'cuda')}",
    ),
]
# Relative Frobenius error per input dtype: bf16/fp16 operands (TF32 for fp32 inputs), fp32 accumulation.
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 3e-3}
SEEDS = {torch.bfloat16: 100000, torch.float16: 200000, torch.float32: 300000}
INPUTS = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")


def run(inputs: dict, chunk: int, backend: str, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels.ssd on a dict of inputs (random_inputs' keys), softplus on, final state returned."""
    return kernels.ssd(
        *(inputs[k] for k in ("x", "dt", "A", "B", "C")),
        chunk,
        D=inputs["D"],
        dt_bias=inputs["dt_bias"],
        dt_softplus=True,
        initial_states=inputs["initial_states"],
        return_final_states=True,
        backend=backend,
        **kw,
    )
