"""The cuTile causal conv + SiLU (kernels/cutile/causal_conv.py) against layers.causal_conv1d_silu in float64:
output and every gradient, over dtypes, sizes that leave partial tiles, k, bias, strided inputs and every
configuration of both tune spaces; then under torch.compile and inside the model."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels.cutile import tuning
from kernels.cutile.causal_conv import bwd_space, causal_conv1d_silu, fwd_space
from kernels.testing import rel_err
from lightning_modules.model.layers import causal_conv1d_silu as reference
from lightning_modules.model.mamba2 import Mamba2Config, Mamba2LM
from tests.gpu_common import CUTILE

pytestmark = CUTILE
F64 = torch.float64
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}  # relative, against float64
SHAPES = [  # b, l, c, k
    (2, 2048, 1792, 4),  # the medium model's conv at batch 2
    (1, 37, 100, 4),  # partial token and channel tiles
    (3, 3, 64, 4),  # fewer tokens than the kernel width
    (2, 130, 72, 3),
    (1, 65, 257, 2),
]


def inputs(b, l, c, k, dtype, bias=True, strided=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    width = c + 24 if strided else c  # a strided view, as the model's xbc is of in_proj's output
    x = torch.randn(b, l, width, device="cuda", generator=gen).to(dtype)[..., :c]
    weight = torch.randn(c, k, device="cuda", generator=gen) / k
    bias_t = torch.randn(c, device="cuda", generator=gen) if bias else None
    dy = torch.randn(b, l, c, device="cuda", generator=gen).to(dtype)
    return x, weight, bias_t, dy


def check(x, weight, bias, dy, tol):
    """Output and gradients of the cuTile conv against the float64 reference on the same (rounded) inputs."""
    leaves = [t if t is None else t.detach().requires_grad_(True) for t in (x, weight, bias)]
    leaves64 = [t if t is None else t.detach().to(F64).requires_grad_(True) for t in (x, weight, bias)]
    y = causal_conv1d_silu(*leaves)
    y64 = reference(*leaves64)
    assert y.dtype == x.dtype and y.shape == y64.shape
    assert rel_err(y, y64) < tol
    present = [i for i, t in enumerate(leaves) if t is not None]
    got = torch.autograd.grad(y, [leaves[i] for i in present], dy)
    want = torch.autograd.grad(y64, [leaves64[i] for i in present], dy.to(F64))
    for i, g, w in zip(present, got, want):
        assert g.dtype == leaves[i].dtype and g.shape == w.shape
        assert rel_err(g, w) < tol, ("x", "weight", "bias")[i]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("b,l,c,k", SHAPES)
@pytest.mark.parametrize("bias,strided", [(True, True), (False, False)])
def test_conv_against_float64(dtype, b, l, c, k, bias, strided):
    check(*inputs(b, l, c, k, dtype, bias, strided), TOL[dtype])


@pytest.mark.parametrize("fwd,bwd", list(itertools.product(fwd_space(), bwd_space())))
def test_every_configuration(fwd, bwd):
    with tuning.forced("conv_fwd", fwd) as fwd_launched, tuning.forced("conv_bwd", bwd) as bwd_launched:
        check(*inputs(2, 133, 300, 4, torch.bfloat16, seed=1), TOL[torch.bfloat16])
    assert fwd_launched == [fwd] and bwd_launched == [bwd]


def test_long_sequence_stays_finite_and_accurate():
    x, weight, bias, dy = inputs(1, 131072, 256, 4, torch.bfloat16, seed=2)
    check(x, weight, bias, dy, TOL[torch.bfloat16])


def test_compiled_fullgraph_matches_eager():
    x, weight, bias, dy = inputs(2, 300, 192, 4, torch.bfloat16, seed=3)

    def f(x, w, b):
        return causal_conv1d_silu(x * 2, w, b) * 3

    leaves = [t.detach().requires_grad_(True) for t in (x, weight, bias)]
    eager = torch.autograd.grad(f(*leaves), leaves, dy)
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(*leaves), leaves, dy)
    for e, c in zip(eager, compiled):
        assert rel_err(c, e.to(F64)) < 1e-6


def test_model_with_cutile_conv_matches_torch_conv():
    cfg = dict(vocab_size=256, d_model=64, n_layer=2, d_state=16, headdim=16, chunk_size=32, ssd_backend="torch")
    torch.manual_seed(0)
    ref_model = Mamba2LM(Mamba2Config(**cfg)).cuda()
    model = Mamba2LM(Mamba2Config(**cfg, conv_backend="cutile")).cuda()
    model.load_state_dict(ref_model.state_dict())
    tokens = torch.randint(0, 256, (2, 97), device="cuda")
    losses = []
    for m in (ref_model, model):
        loss = m(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(loss.detach())
    assert rel_err(losses[1], losses[0].to(F64)) < 1e-5
    for (name, p_ref), p in zip(ref_model.named_parameters(), model.parameters()):
        assert rel_err(p.grad, p_ref.grad.to(F64)) < 1e-4, name
