"""The cuTile backward (backward="cutile") end to end: every input's gradient against the reference path
(autograd through kernels.reference on the same inputs) and against a float64 oracle (autograd through the
reference in float64, itself checked against the token recurrence on the CPU).

Loss: Σ dy · y + <dfinal, final_state> with random dy and dfinal. Tolerances are relative Frobenius errors
per input dtype (tests.gpu_common.TOL), the same as the forward's.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import kernels
from bench.inputs import random_inputs, rel_err
from bench.timing import graph_replay
from tests.gpu_common import CUTILE, INPUTS, SEEDS, TOL, run

pytestmark = CUTILE
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# 3 dtypes x chunk 64/128 x head dim 64/128 x state 64/128 = 24, plus 13 edge shapes x 2 dtypes = 50.
# The backward runs at chunk 64 whatever the forward's chunk (kernels.cutile.launch.BACKWARD_CHUNK).
GRID = list(itertools.product(DTYPES, (64, 128), (64, 128), (64, 128)))
EDGES = [  # (b, l, h, p, g, n, chunk, init, dfinal, D, dt_bias)
    (1, 1, 2, 64, 1, 64, 64, False, True, True, True),
    (2, 63, 4, 64, 2, 64, 64, True, True, True, True),
    (2, 129, 4, 64, 4, 128, 128, True, True, False, True),
    (1, 1000, 8, 64, 1, 128, 128, False, False, True, True),
    (3, 257, 6, 64, 3, 64, 64, True, True, True, False),
    (1, 300, 2, 32, 1, 16, 64, True, True, True, True),
    (2, 200, 8, 128, 2, 128, 64, False, True, True, True),
    (1, 513, 4, 64, 2, 128, 128, True, False, False, False),
    (2, 96, 4, 48, 1, 40, 32, True, True, True, True),
    (1, 77, 2, 64, 1, 64, 16, False, True, True, True),
    (4, 256, 8, 64, 1, 128, 128, True, True, True, True),
    (2, 130, 12, 64, 12, 64, 128, True, True, True, True),
    (2, 600, 4, 64, 2, 128, 256, True, True, True, True),
]


def gradients(inputs: dict, chunk: int, backend: str, dy, dfinal, dtype=None, **kw) -> dict:
    """Gradients of Σ dy·y + <dfinal, final> for every present input (cast to `dtype` first if given)."""
    leaves = {}
    for k, v in inputs.items():
        if v is not None:
            v = v.to(dtype) if dtype is not None else v
            leaves[k] = v.detach().clone().requires_grad_(True)
        else:
            leaves[k] = None
    y, final = run(leaves, chunk, backend, **kw)
    loss = (y * dy.to(y.dtype)).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal.to(final.dtype)).sum()
    loss.backward()
    return {k: v.grad for k, v in leaves.items() if v is not None}


def check(inputs, chunk, dtype, with_dfinal=True, tol_scale=1.0):
    b, l, h, p = inputs["x"].shape
    n = inputs["B"].shape[-1]
    gen = torch.Generator(device="cpu").manual_seed(l * 7 + n)
    dy = torch.randn(b, l, h, p, generator=gen).to("cuda", dtype)
    dfinal = torch.randn(b, h, p, n, generator=gen).cuda() if with_dfinal else None
    got = gradients(inputs, chunk, "cutile", dy, dfinal, backward="cutile")
    ref = gradients(inputs, chunk, "torch", dy, dfinal)
    oracle = gradients(inputs, chunk, "torch", dy, dfinal, dtype=torch.float64)
    for name in INPUTS:
        if inputs[name] is None:
            assert name not in got
            continue
        assert got[name].dtype == inputs[name].dtype and got[name].shape == inputs[name].shape, name
        assert rel_err(got[name], oracle[name]) < TOL[dtype] * tol_scale, f"{name} vs float64"
        assert rel_err(got[name], ref[name]) < TOL[dtype] * tol_scale, f"{name} vs reference path"


@pytest.mark.parametrize("dtype,chunk,p,n", GRID, ids=lambda v: str(v).replace("torch.", ""))
def test_grid(dtype, chunk, p, n):
    l = 2 * chunk + 37
    inputs = random_inputs(2, l, 4, p, 2, n, dtype, seed=SEEDS[dtype] + chunk + p + n, device="cuda", init=True)
    check(inputs, chunk, dtype)


@pytest.mark.parametrize("b,l,h,p,g,n,chunk,init,dfinal,D,bias", EDGES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_edges(b, l, h, p, g, n, chunk, init, dfinal, D, bias, dtype):
    inputs = random_inputs(b, l, h, p, g, n, dtype, seed=l * 31 + n, device="cuda", init=init, D=D, dt_bias=bias)
    check(inputs, chunk, dtype, with_dfinal=dfinal)


def test_fp32_dt_with_bf16_activations():
    """The training layout: x, B, C in bf16, dt and the parameters in fp32."""
    inputs = random_inputs(2, 300, 8, 64, 1, 128, torch.bfloat16, seed=3, device="cuda", dt_dtype=torch.float32)
    check(inputs, 128, torch.bfloat16)


def test_finite_differences_fp32():
    """Directional derivatives of the cuTile gradients (fp32 inputs) against central differences of the loss,
    the loss evaluated in float64 (the reference forward) so the differences carry no TF32 rounding.

    The kernels multiply fp32 inputs in TF32, so a gradient g carries a relative error of about 1e-3 of |g|:
    the bound is 5e-3 |g| |v|, not a fraction of g · v (a random direction can cancel most of g · v).
    A sign error, or a gradient off by a factor far from 1, moves g · v by the order of |g| |v| / sqrt(numel)
    and fails; small factor errors are the reference grids' to catch."""
    inputs = random_inputs(1, 70, 2, 16, 1, 16, torch.float32, seed=21, device="cuda", init=True)
    gen = torch.Generator(device="cpu").manual_seed(5)
    dy = torch.randn(1, 70, 2, 16, generator=gen).cuda()
    dfinal = torch.randn(1, 2, 16, 16, generator=gen).cuda()
    grads = gradients(inputs, 32, "cutile", dy, dfinal, backward="cutile")
    exact = {k: None if v is None else v.double() for k, v in inputs.items()}

    def loss(t):
        with torch.no_grad():
            y, final = run(t, 32, "torch")
            return ((y * dy.double()).sum() + (final * dfinal.double()).sum()).item()

    for name, g in grads.items():
        v = torch.randn(g.shape, generator=gen, dtype=torch.float64).cuda()
        eps = 1e-6
        numeric = (loss({**exact, name: exact[name] + eps * v}) - loss({**exact, name: exact[name] - eps * v})) / (
            2 * eps
        )
        analytic = (g.double() * v).sum().item()
        bound = 5e-3 * g.double().norm().item() * v.norm().item() + 1e-6
        assert abs(numeric - analytic) <= bound, (name, numeric, analytic, bound)


def test_long_sequence_no_overflow():
    """131072 + 37 tokens in bf16: finite gradients equal to the reference path's."""
    inputs = random_inputs(1, 131072 + 37, 4, 64, 1, 128, torch.bfloat16, seed=11, device="cuda")
    dy = torch.randn(inputs["x"].shape, generator=torch.Generator().manual_seed(2)).to("cuda", torch.bfloat16)
    got = gradients(inputs, 128, "cutile", dy, None, backward="cutile")
    ref = gradients(inputs, 128, "torch", dy, None)
    for name, g in got.items():
        assert rel_err(g, ref[name]) < TOL[torch.bfloat16], name


def test_every_gradient_written():
    """Poisoned memory: a NaN left in any gradient means an element was never written."""
    torch.cuda.empty_cache()
    junk = torch.full((1 << 26,), float("nan"), device="cuda")
    del junk
    inputs = random_inputs(2, 333, 4, 64, 2, 64, torch.float32, seed=3, device="cuda", init=True)
    dy = torch.randn(2, 333, 4, 64, device="cuda")
    for g in gradients(inputs, 64, "cutile", dy, torch.randn(2, 4, 64, 64, device="cuda"), backward="cutile").values():
        assert torch.isfinite(g).all()


def test_the_ways_to_run_the_walks_agree():
    """The cuTile backward with its state recompute on the device's second stream (walks "aside") runs the same
    kernels as on one stream: every gradient equal bit for bit, also when the call is captured in a CUDA graph and
    replayed on fresh inputs (the fork and join are captured with it). Both walks in one launch ("one launch", the
    default, a build of its own) agree with them within the bf16 tolerance."""
    from kernels.cutile.ssd import ssd_backward
    from kernels.cutile.state_walks import WALK_MODES

    names = ("dx", "ddt", "dB", "dC", "dheads", "dinitial_states")
    inputs = random_inputs(2, 1000, 8, 64, 1, 128, torch.bfloat16, seed=13, device="cuda", init=True)
    dy = torch.randn(inputs["x"].shape, generator=torch.Generator().manual_seed(4)).to("cuda", torch.bfloat16)
    dfinal = torch.randn(2, 8, 64, 128, generator=torch.Generator().manual_seed(5)).cuda()

    def backward(t: dict, walks: str) -> tuple:
        args = (*(t[k] for k in ("x", "dt", "A", "B", "C")), 128, t["D"], t["dt_bias"], True, t["initial_states"])
        return ssd_backward(dy, dfinal, *args, walks=walks)

    got = {walks: backward(inputs, walks) for walks in WALK_MODES}
    for name, g, aside, one_launch in zip(names, got["one stream"], got["aside"], got["one launch"], strict=True):
        assert torch.equal(g, aside), name
        assert rel_err(one_launch, g) < TOL[torch.bfloat16], f"{name}, one launch"

    static = {k: None if v is None else v.clone() for k, v in inputs.items()}
    out = {}

    def step():
        out["grads"] = backward(static, "aside")

    replay = graph_replay(step)
    fresh = random_inputs(2, 1000, 8, 64, 1, 128, torch.bfloat16, seed=14, device="cuda", init=True)
    for k, v in static.items():
        if v is not None:
            v.copy_(fresh[k])
    replay()
    torch.cuda.synchronize()
    for name, g, want in zip(names, out["grads"], backward(fresh, "one stream"), strict=True):
        assert torch.equal(g, want), f"{name} after replay"


def test_torch_compile_fullgraph():
    inputs = random_inputs(2, 256, 4, 64, 1, 64, torch.bfloat16, seed=9, device="cuda")
    x = inputs["x"].clone().requires_grad_(True)

    def f(x):
        y = kernels.ssd(x, *(inputs[k] for k in ("dt", "A", "B", "C")), 64, D=inputs["D"], dt_bias=inputs["dt_bias"],
                        dt_softplus=True, backend="cutile", backward="cutile")  # fmt: skip
        return (y.float() ** 2).mean()

    loss = torch.compile(f, fullgraph=True)(x)
    loss.backward()
    g_compiled = x.grad.clone()
    x.grad = None
    eager = f(x)
    eager.backward()
    assert torch.allclose(loss, eager, rtol=1e-3)
    assert rel_err(g_compiled, x.grad) < 1e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU (cuda:1)")
def test_second_device():
    inputs = random_inputs(2, 300, 4, 64, 1, 64, torch.bfloat16, seed=5, device="cuda:1")
    dy = torch.randn(2, 300, 4, 64, generator=torch.Generator().manual_seed(1)).to("cuda:1", torch.bfloat16)
    with torch.cuda.device(0):  # the current device is not the inputs': launches must follow the inputs
        got = gradients(inputs, 64, "cutile", dy, None, backward="cutile")
    on0 = {k: None if v is None else v.to("cuda:0") for k, v in inputs.items()}
    ref = gradients(on0, 64, "cutile", dy.to("cuda:0"), None, backward="cutile")
    for name, g in got.items():
        assert g.device == torch.device("cuda:1")
        assert torch.equal(g.cpu(), ref[name].cpu()), name


def test_bad_backward_is_refused():
    inputs = random_inputs(1, 64, 2, 64, 1, 64, torch.bfloat16, seed=1, device="cuda")
    with pytest.raises(ValueError, match="backward must be one of"):
        run(inputs, 64, "cutile", backward="fast")
    with pytest.raises(ValueError, match="needs the cutile backend"):
        run(inputs, 64, "torch", backward="cutile")
