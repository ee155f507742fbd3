"""The cuTile backend on a GPU: against the float64 recurrence, the reference, mamba_ssm's Triton kernels.

Run on the GPU machine: `pytest -m gpu`. Tolerances are relative Frobenius errors ‖out − ref‖ / ‖ref‖,
per input dtype: the kernels multiply bf16/fp16 operands (or TF32 for fp32 inputs) with fp32
accumulation, so bf16 lands near 4e-3, fp16 near 5e-4, fp32 (TF32) near 3e-4.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

import kernels
from bench.inputs import random_inputs, rel_err
from kernels.reference import ssd_recurrent
from tests.gpu_common import CUTILE, SEEDS, TOL, run

pytestmark = CUTILE


def make_inputs(b, l, h, p, g, n, dtype, *, seed, device="cuda", **kw):
    return random_inputs(b, l, h, p, g, n, dtype, seed=seed, device=device, **kw)


def oracle(inputs):
    """The float64 recurrence on the same (rounded) inputs."""
    keys = ("x", "dt", "A", "B", "C", "D", "dt_bias")
    return ssd_recurrent(*(inputs[k] for k in keys), True, inputs["initial_states"])


# 3 dtypes x 3 chunk sizes x 2 head dims x 2 state dims = 36, plus 12 edge shapes x 2 dtypes below: 60 configurations.
GRID = [
    (dtype, chunk, p, n)
    for dtype, chunk, p, n in itertools.product(
        (torch.bfloat16, torch.float16, torch.float32), (64, 128, 256), (64, 128), (64, 128)
    )
]
EDGES = [  # (b, l, h, p, g, n, chunk, init)
    (1, 1, 2, 64, 1, 64, 64, False),
    (2, 63, 4, 64, 2, 64, 64, True),
    (2, 129, 4, 64, 4, 128, 128, True),
    (1, 1000, 8, 64, 1, 128, 128, False),
    (3, 257, 6, 64, 3, 64, 256, True),
    (1, 300, 2, 32, 1, 16, 64, True),
    (2, 200, 8, 128, 2, 128, 64, False),
    (1, 513, 4, 64, 2, 128, 256, True),
    (2, 96, 4, 48, 1, 40, 32, True),
    (1, 77, 2, 64, 1, 64, 16, False),
    (4, 256, 8, 64, 1, 128, 128, True),
    (2, 130, 12, 64, 4, 64, 128, True),
]


@pytest.mark.parametrize("dtype,chunk,p,n", GRID, ids=lambda v: str(v).replace("torch.", ""))
def test_grid_vs_oracle_and_reference(dtype, chunk, p, n):
    b, h, g = 2, 4, 2
    l = chunk * 2 + 37  # not a multiple of the chunk
    inputs = make_inputs(b, l, h, p, g, n, dtype, seed=SEEDS[dtype] + chunk * 1000 + p * 10 + n, init=True)
    y, state = run(inputs, chunk, "cutile")
    assert y.dtype == dtype and y.shape == (b, l, h, p)
    assert state.dtype == torch.float32 and state.shape == (b, h, p, n)
    y64, s64 = oracle(inputs)
    y_ref, s_ref = run(inputs, chunk, "torch")
    tol = TOL[dtype]
    assert rel_err(y, y64) < tol
    assert rel_err(state, s64) < tol
    assert rel_err(y, y_ref) < tol
    assert rel_err(state, s_ref) < tol


@pytest.mark.parametrize("b,l,h,p,g,n,chunk,init", EDGES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_edge_shapes_vs_oracle(b, l, h, p, g, n, chunk, init, dtype):
    inputs = make_inputs(b, l, h, p, g, n, dtype, seed=l * 31 + n, init=init, D=bool(l % 2), dt_bias=bool(l % 3))
    y, state = run(inputs, chunk, "cutile")
    y64, s64 = oracle(inputs)
    assert rel_err(y, y64) < TOL[dtype]
    assert rel_err(state, s64) < TOL[dtype]


def test_every_output_written():
    """Poisoned memory: a NaN left anywhere in y means an element was never written."""
    torch.cuda.empty_cache()
    junk = torch.full((1 << 26,), float("nan"), device="cuda")
    del junk  # the caching allocator hands this NaN-filled block to the next allocations
    inputs = make_inputs(2, 333, 4, 64, 1, 64, torch.float32, seed=3, init=True)
    y, state = run(inputs, 64, "cutile")
    assert torch.isfinite(y).all() and torch.isfinite(state).all()


def test_gradients_equal_reference_path():
    inputs = make_inputs(2, 200, 4, 64, 2, 64, torch.float32, seed=7, init=True)
    grads = {}
    for backend in ("cutile", "torch"):
        leaves = {k: (v.clone().requires_grad_(True) if v is not None else None) for k, v in inputs.items()}
        y, state = run(leaves, 64, backend)
        gy = torch.randn_like(y, generator=torch.Generator("cuda").manual_seed(1))
        (y * gy).sum().add((state * 0.1).sum()).backward()
        grads[backend] = {k: v.grad for k, v in leaves.items() if v is not None}
    for name, g_ref in grads["torch"].items():
        g = grads["cutile"][name]
        assert g is not None, f"no gradient for {name}"
        assert rel_err(g, g_ref) < 1e-4, name


def test_long_sequence_no_index_overflow():
    """131072 + 37 tokens: offsets past 2**31 bytes in x and the chunk states."""
    b, l, h, p, g, n = 1, 131072 + 37, 4, 64, 1, 128
    inputs = make_inputs(b, l, h, p, g, n, torch.bfloat16, seed=11, init=False)
    y, state = run(inputs, 128, "cutile")
    y_ref, s_ref = run(inputs, 128, "torch")
    assert rel_err(y, y_ref) < TOL[torch.bfloat16]
    assert rel_err(y[:, -1000:], y_ref[:, -1000:]) < TOL[torch.bfloat16]  # the far end is right too
    assert rel_err(state, s_ref) < TOL[torch.bfloat16]


def test_runs_on_side_stream():
    inputs = make_inputs(2, 300, 4, 64, 1, 64, torch.bfloat16, seed=5)
    y0, _ = run(inputs, 64, "cutile")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y1, _ = run(inputs, 64, "cutile")
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(y0, y1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU (cuda:1)")
def test_second_device():
    inputs = make_inputs(2, 300, 4, 64, 1, 64, torch.bfloat16, seed=5, device="cuda:1")
    y1, _ = run(inputs, 64, "cutile")
    y0, _ = run({k: None if v is None else v.to("cuda:0") for k, v in inputs.items()}, 64, "cutile")
    assert y1.device == torch.device("cuda:1")
    assert torch.equal(y1.cpu(), y0.cpu())


def test_torch_compile_fullgraph():
    inputs = make_inputs(2, 256, 4, 64, 1, 64, torch.bfloat16, seed=9, init=False)
    x = inputs["x"].clone().requires_grad_(True)

    def f(x):
        y = kernels.ssd(
            x,
            inputs["dt"],
            inputs["A"],
            inputs["B"],
            inputs["C"],
            64,
            D=inputs["D"],
            dt_bias=inputs["dt_bias"],
            dt_softplus=True,
            backend="cutile",
        )
        return (y.float() ** 2).mean()

    compiled = torch.compile(f, fullgraph=True)
    loss = compiled(x)
    loss.backward()
    g_compiled = x.grad.clone()
    x.grad = None
    f(x).backward()
    assert torch.allclose(loss, f(x), rtol=1e-3)
    assert rel_err(g_compiled, x.grad) < 1e-3


def test_bad_inputs_raise_clear_errors():
    inputs = make_inputs(1, 64, 2, 64, 1, 64, torch.bfloat16, seed=1)
    x64 = inputs["x"].double()
    with pytest.raises(ValueError, match="dtype"):
        kernels.ssd(x64, inputs["dt"], inputs["A"], inputs["B"].double(), inputs["C"].double(), 64, backend="cutile")
    xt = inputs["x"].transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match=r"contiguous\(\)"):
        kernels.ssd(xt, inputs["dt"], inputs["A"], inputs["B"], inputs["C"], 64, backend="cutile")
    with pytest.raises(ValueError, match="chunk_size"):
        kernels.ssd(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], 100, backend="cutile")
    with pytest.raises(ValueError, match="is on cpu"):
        kernels.ssd(inputs["x"], inputs["dt"].cpu(), inputs["A"], inputs["B"], inputs["C"], 64, backend="cutile")


@pytest.mark.skipif(os.environ.get("SKIP_TRITON") == "1", reason="Triton comparison switched off")
def test_matches_mamba_ssm_triton_on_seed_shape():
    pytest.importorskip("mamba_ssm", reason="mamba_ssm (the Triton baseline) is not installed")
    b, l, h, p, g, n = 4, 16384, 8, 64, 1, 128
    inputs = make_inputs(b, l, h, p, g, n, torch.bfloat16, seed=13)
    inputs["dt"] = inputs["dt"].float()
    y_cu, s_cu = run(inputs, 128, "cutile")
    y_tr, s_tr = run(inputs, 128, "triton")
    assert rel_err(y_cu, y_tr) < TOL[torch.bfloat16]
    assert rel_err(s_cu, s_tr) < TOL[torch.bfloat16]
