"""The block's cuTile layers against their PyTorch references in float64: the causal conv + SiLU
(kernels/cutile/causal_conv.py, against layers.causal_conv1d_silu) and the gated RMSNorm (kernels/cutile/rms_norm.py,
against layers.rms_norm). Output and every gradient over dtypes, sizes that leave partial tiles, strided inputs and
every configuration of both tune spaces; then under torch.compile, and inside the model. The conv also with document
ids (seq_idx): boundaries at random, at tile edges, and one-token documents."""

from __future__ import annotations

import pytest
import torch

from bench.inputs import rel_err
from kernels.cutile import tuning
from kernels.cutile.causal_conv import bwd_space as conv_bwd_space
from kernels.cutile.causal_conv import causal_conv1d_silu as cutile_conv
from kernels.cutile.causal_conv import dx_space as conv_dx_space
from kernels.cutile.causal_conv import fwd_space as conv_fwd_space
from kernels.cutile.rms_norm import bwd_space as norm_bwd_space
from kernels.cutile.rms_norm import fwd_space as norm_fwd_space
from kernels.cutile.rms_norm import rms_norm as cutile_norm
from model.layers import causal_conv1d_silu, rms_norm
from model.mamba2 import Mamba2Config, Mamba2LM
from tests.gpu_common import CUTILE

pytestmark = CUTILE
F64 = torch.float64
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}  # relative, against float64

# -- the causal conv + SiLU ----------------------------------------------------------------------------------
CONV_SHAPES = [  # b, l, c, k
    (2, 2048, 1792, 4),  # the medium model's conv at batch 2
    (1, 37, 100, 4),  # partial token and channel tiles
    (3, 3, 64, 4),  # fewer tokens than the kernel width
    (2, 130, 72, 3),
    (1, 65, 257, 2),
]


def conv_inputs(b, l, c, k, dtype, bias=True, strided=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    width = c + 24 if strided else c  # a strided view, as the model's xbc is of in_proj's output
    x = torch.randn(b, l, width, device="cuda", generator=gen).to(dtype)[..., :c]
    weight = torch.randn(c, k, device="cuda", generator=gen) / k
    bias_t = torch.randn(c, device="cuda", generator=gen) if bias else None
    dy = torch.randn(b, l, c, device="cuda", generator=gen).to(dtype)
    return x, weight, bias_t, dy


def parts(c: int) -> list[int]:
    """The conv's output split in three channel parts, as the model's x, B and C (one part below 4 channels)."""
    return [c] if c < 4 else [c - 2 * (c // 4), c // 4, c // 4]


def random_seq_idx(b: int, l: int, seed: int = 0) -> torch.Tensor:
    """Document ids (b, l) int32 on the GPU, non-decreasing along each row, row r's starting at r: boundaries at
    random, at the token tiles' edges (16 to 256; tiles of 8 and the gv kernel's segments have theirs there too), a
    one-token document at the row's start, in its middle, and on each side of token 32 (a tile's last and first)."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.zeros(b, l, dtype=torch.bool)  # whether a document starts at token t
    starts[:, [t for t in (1, l // 2, l // 2 + 1, 31, 32, 33, 16, 64, 128, 256) if t < l]] = True
    if l > 1:
        starts.scatter_(1, torch.randint(1, l, (b, max(1, l // 12)), generator=gen), True)
    starts[:, 0] = False
    return (starts.cumsum(1) + torch.arange(b)[:, None]).to(torch.int32).cuda()


def conv_check(x, weight, bias, dy, tol, seq_idx=None, sizes=None):
    """Output and gradients of the cuTile conv (its three parts, concatenated, or `sizes`) against the float64
    reference on the same (rounded) inputs, with the document ids seq_idx where given."""
    leaves = [t if t is None else t.detach().requires_grad_(True) for t in (x, weight, bias)]
    leaves64 = [t if t is None else t.detach().to(F64).requires_grad_(True) for t in (x, weight, bias)]
    y = torch.cat(cutile_conv(*leaves, sizes or parts(x.shape[-1]), seq_idx=seq_idx), dim=-1)
    y64 = causal_conv1d_silu(*leaves64, seq_idx=seq_idx)
    assert y.dtype == x.dtype and y.shape == y64.shape
    assert rel_err(y, y64) < tol
    present = [i for i, t in enumerate(leaves) if t is not None]
    got = torch.autograd.grad(y, [leaves[i] for i in present], dy)
    want = torch.autograd.grad(y64, [leaves64[i] for i in present], dy.to(F64))
    for i, g, w in zip(present, got, want):
        assert g.dtype == leaves[i].dtype and g.shape == w.shape
        assert g.is_contiguous(), ("x", "weight", "bias")[i]  # as the ops' fake kernels declare (torch.compile)
        assert rel_err(g, w) < tol, ("x", "weight", "bias")[i]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("b,l,c,k", CONV_SHAPES)
@pytest.mark.parametrize("bias,strided", [(True, True), (False, False)])
def test_conv_against_float64(dtype, b, l, c, k, bias, strided):
    conv_check(*conv_inputs(b, l, c, k, dtype, bias, strided), TOL[dtype])


def every_one(*spaces: list) -> list[tuple]:
    """Tuples that take every configuration of each list at least once (the shorter lists cycle)."""
    longest = max(len(space) for space in spaces)
    return [tuple(space[i % len(space)] for space in spaces) for i in range(longest)]


@pytest.mark.parametrize("fwd,bwd,dx", every_one(conv_fwd_space(), conv_bwd_space(), conv_dx_space()))
def test_conv_every_configuration(fwd, bwd, dx):
    """Each configuration of the forward's, the gv kernel's and the dx kernel's tune spaces."""
    with (
        tuning.forced("conv_fwd", fwd) as fwd_launched,
        tuning.forced("conv_bwd", bwd) as bwd_launched,
        tuning.forced("conv_bwd_dx", dx) as dx_launched,
    ):
        conv_check(*conv_inputs(2, 133, 300, 4, torch.bfloat16, seed=1), TOL[torch.bfloat16])
    n = len(parts(300))  # a launch of each kernel per part
    assert fwd_launched == [fwd] * n and bwd_launched == [bwd] * n and dx_launched == [dx] * n


@pytest.mark.parametrize("bwd", conv_bwd_space())
def test_conv_one_launch_every_configuration(bwd):
    """Parts of whole column tiles (512 channels: 256, 128, 128) take one gv launch for all three, at each of its
    configurations."""
    with tuning.forced("conv_bwd", bwd) as bwd_launched:
        conv_check(*conv_inputs(2, 133, 512, 4, torch.bfloat16, seed=4), TOL[torch.bfloat16])
    assert bwd_launched == [bwd]


@pytest.mark.parametrize("fwd", [cfg for cfg in conv_fwd_space() if 128 % cfg.TILE_C == 0])
def test_conv_fwd_one_launch_every_configuration(fwd):
    """Parts of whole column tiles (512 channels: 256, 128, 128) take one forward launch for all three, at each of
    its configurations (those whose column tiles divide every part)."""
    with tuning.forced("conv_fwd", fwd) as fwd_launched:
        conv_check(*conv_inputs(2, 133, 512, 4, torch.bfloat16, seed=5), TOL[torch.bfloat16])
    assert fwd_launched == [fwd]


def test_conv_fwd_one_launch_refuses_tiles_straddling_parts():
    """A pinned forward configuration whose column tiles would straddle two parts is one clear error."""
    straddling = next(cfg for cfg in conv_fwd_space() if 128 % cfg.TILE_C)
    x, weight, bias, _ = conv_inputs(2, 133, 512, 4, torch.bfloat16, seed=5)
    with tuning.forced("conv_fwd", straddling), pytest.raises(ValueError, match="straddle the parts"):
        cutile_conv(x, weight, bias, parts(512))


def test_conv_long_sequence_stays_finite_and_accurate():
    x, weight, bias, dy = conv_inputs(1, 131072, 256, 4, torch.bfloat16, seed=2)
    conv_check(x, weight, bias, dy, TOL[torch.bfloat16])


def test_conv_compiled_fullgraph_matches_eager():
    x, weight, bias, dy = conv_inputs(2, 300, 192, 4, torch.bfloat16, seed=3)

    def f(x, w, b):
        return torch.cat(cutile_conv(x * 2, w, b, parts(x.shape[-1])), dim=-1) * 3

    leaves = [t.detach().requires_grad_(True) for t in (x, weight, bias)]
    eager = torch.autograd.grad(f(*leaves), leaves, dy)
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(*leaves), leaves, dy)
    for e, c in zip(eager, compiled):
        assert rel_err(c, e.to(F64)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("b,l,c,k", CONV_SHAPES)
@pytest.mark.parametrize("bias,strided", [(True, True), (False, False)])
def test_conv_with_seq_idx_against_float64(dtype, b, l, c, k, bias, strided):
    """Three parts: one launch over all of them (1792 channels) or a launch per part (the others)."""
    x, weight, bias_t, dy = conv_inputs(b, l, c, k, dtype, bias, strided, seed=6)
    conv_check(x, weight, bias_t, dy, TOL[dtype], seq_idx=random_seq_idx(b, l, seed=l))


@pytest.mark.parametrize("b,l,c,k", [(2, 300, 192, 4), (3, 70, 100, 3), (1, 1, 64, 4)])
def test_conv_with_seq_idx_one_part(b, l, c, k):
    x, weight, bias, dy = conv_inputs(b, l, c, k, torch.bfloat16, seed=7)
    conv_check(x, weight, bias, dy, TOL[torch.bfloat16], seq_idx=random_seq_idx(b, l, seed=1), sizes=[c])


def test_conv_with_seq_idx_every_token_its_own_document():
    """Every tap but the unshifted one masked: y = SiLU(bias + w[:, k - 1] x)."""
    b, l, c = 2, 77, 128
    x, weight, bias, dy = conv_inputs(b, l, c, 4, torch.float32, seed=8)
    seq_idx = torch.arange(l, device="cuda", dtype=torch.int32).expand(b, l)
    conv_check(x, weight, bias, dy, TOL[torch.float32], seq_idx=seq_idx)
    y = torch.cat(cutile_conv(x, weight, bias, parts(c), seq_idx=seq_idx), dim=-1)
    assert rel_err(y, torch.nn.functional.silu(bias + weight[:, 3] * x).to(F64)) < TOL[torch.float32]


def test_conv_with_one_document_is_bitwise_the_conv_without_ids():
    """Ids all alike mask nothing: the same values and gradients, bit for bit, as without ids."""
    x, weight, bias, dy = conv_inputs(2, 133, 512, 4, torch.bfloat16, seed=9)
    seq_idx = torch.full((2, 133), 5, device="cuda", dtype=torch.int32)
    results = []
    for ids in (None, seq_idx):
        leaves = [t.detach().requires_grad_(True) for t in (x, weight, bias)]
        y = torch.cat(cutile_conv(*leaves, parts(512), seq_idx=ids), dim=-1)
        results.append([y, *torch.autograd.grad(y, leaves, dy)])
    for without, with_ids in zip(*results):
        assert torch.equal(without, with_ids)


@pytest.mark.parametrize("fwd,bwd,dx", every_one(conv_fwd_space(), conv_bwd_space(), conv_dx_space()))
def test_conv_with_seq_idx_every_configuration(fwd, bwd, dx):
    """Each configuration tuning can pick for a launch with document ids (the keys' own: `_seq_idx`)."""
    with (
        tuning.forced("conv_fwd", fwd) as fwd_launched,
        tuning.forced("conv_bwd", bwd) as bwd_launched,
        tuning.forced("conv_bwd_dx", dx) as dx_launched,
    ):
        x, weight, bias, dy = conv_inputs(2, 133, 300, 4, torch.bfloat16, seed=10)
        conv_check(x, weight, bias, dy, TOL[torch.bfloat16], seq_idx=random_seq_idx(2, 133, seed=3))
    n = len(parts(300))
    assert fwd_launched == [fwd] * n and bwd_launched == [bwd] * n and dx_launched == [dx] * n


@pytest.mark.parametrize("bwd", conv_bwd_space())
def test_conv_with_seq_idx_one_launch_every_configuration(bwd):
    """Parts of whole column tiles (512 channels) in one gv launch, with document ids, at each configuration."""
    with tuning.forced("conv_bwd", bwd) as bwd_launched:
        x, weight, bias, dy = conv_inputs(2, 133, 512, 4, torch.bfloat16, seed=11)
        conv_check(x, weight, bias, dy, TOL[torch.bfloat16], seq_idx=random_seq_idx(2, 133, seed=4))
    assert bwd_launched == [bwd]


def test_conv_with_seq_idx_is_tuned_apart():
    """A launch with document ids is decided under its own key; one without keeps the shipped table's."""
    x, weight, bias, _ = conv_inputs(8, 2048, 1792, 4, torch.bfloat16, seed=12)
    sizes = [1536, 128, 128]  # the medium model's x, B and C: tuned.json's key
    x = x.detach().requires_grad_(True)
    y = cutile_conv(x, weight, bias, sizes, seq_idx=random_seq_idx(8, 2048))
    torch.cat(y, dim=-1).sum().backward()
    cutile_conv(x, weight, bias, sizes)
    keys = [key.split("|")[1] for key in tuning.chosen() if key.startswith("conv_fwd|b8_l2048_c1792")]
    assert sorted(keys) == [
        "b8_l2048_c1792_k4_bfloat16_parts1536-128-128",
        "b8_l2048_c1792_k4_bfloat16_seq_idx_parts1536-128-128",
    ]
    assert "conv_bwd|b8_l2048_c1792_k4_bfloat16_seq_idx_parts1536-128-128" in tuning.chosen()
    assert "conv_bwd_dx|b8_l2048_c1792_k4_bfloat16_seq_idx" in tuning.chosen()


def test_conv_long_sequence_with_seq_idx():
    b, l = 1, 131072
    x, weight, bias, dy = conv_inputs(b, l, 256, 4, torch.bfloat16, seed=13)
    conv_check(x, weight, bias, dy, TOL[torch.bfloat16], seq_idx=random_seq_idx(b, l, seed=5))


def test_conv_with_seq_idx_compiled_fullgraph_matches_eager():
    x, weight, bias, dy = conv_inputs(2, 300, 192, 4, torch.bfloat16, seed=14)
    seq_idx = random_seq_idx(2, 300, seed=6)

    def f(x, w, b, seq_idx):
        return torch.cat(cutile_conv(x * 2, w, b, parts(x.shape[-1]), seq_idx=seq_idx), dim=-1) * 3

    leaves = [t.detach().requires_grad_(True) for t in (x, weight, bias)]
    eager = torch.autograd.grad(f(*leaves, seq_idx), leaves, dy)
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(*leaves, seq_idx), leaves, dy)
    for e, c in zip(eager, compiled):
        assert rel_err(c, e.to(F64)) < 1e-6


# -- the gated RMSNorm ---------------------------------------------------------------------------------------
NORM_SHAPES = [  # rows (b, l), d, group size
    ((2, 2048), 1536, 1536),  # the medium model's gated norm at batch 2
    ((1, 37), 256, 64),  # four groups, a partial token tile
    ((3, 5), 1536, 768),
    ((1, 300), 48, 48),  # a group that is not a power of two: blocks of 16
]


def norm_inputs(rows, d, dtype, gated=True, strided=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*rows, d, device="cuda", generator=gen).to(dtype)
    width = d + 40 if strided else d  # a strided view, as the model's z is of in_proj's output
    z = torch.randn(*rows, width, device="cuda", generator=gen).to(dtype)[..., :d] if gated else None
    weight = 1 + 0.1 * torch.randn(d, device="cuda", generator=gen)
    dout = torch.randn(*rows, d, device="cuda", generator=gen).to(dtype)
    return x, weight, z, dout


def norm_check(x, weight, z, dout, group, tol, out_dtype=None):
    """Output and gradients against the float64 reference on the same (rounded) inputs."""
    out_dtype = out_dtype or x.dtype
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in (x, weight, z)]
    leaves64 = [None if t is None else t.detach().to(F64).requires_grad_(True) for t in (x, weight, z)]
    out = cutile_norm(leaves[0], leaves[1], 1e-5, leaves[2], group, out_dtype)
    out64 = rms_norm(leaves64[0], leaves64[1], 1e-5, leaves64[2], group)
    assert out.dtype == out_dtype and out.shape == out64.shape
    assert rel_err(out, out64) < tol
    present = [i for i, t in enumerate(leaves) if t is not None]
    got = torch.autograd.grad(out, [leaves[i] for i in present], dout.to(out_dtype))
    want = torch.autograd.grad(out64, [leaves64[i] for i in present], dout.to(out_dtype).to(F64))
    for i, g, w in zip(present, got, want):
        assert g.dtype == leaves[i].dtype and g.shape == w.shape
        assert rel_err(g, w) < tol, ("x", "weight", "z")[i]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("rows,d,group", NORM_SHAPES)
@pytest.mark.parametrize("gated,strided", [(True, True), (False, False)])
def test_norm_against_float64(dtype, rows, d, group, gated, strided):
    norm_check(*norm_inputs(rows, d, dtype, gated, strided), group, TOL[dtype])


@pytest.mark.parametrize("fwd,bwd", every_one(norm_fwd_space(), norm_bwd_space()))
def test_norm_every_configuration(fwd, bwd):
    with tuning.forced("norm_fwd", fwd) as fwd_launched, tuning.forced("norm_bwd", bwd) as bwd_launched:
        norm_check(*norm_inputs((2, 45), 768, torch.bfloat16, seed=1), 384, TOL[torch.bfloat16])
    assert fwd_launched == [fwd] and bwd_launched == [bwd]


def test_norm_fp32_residual_into_bf16_output():
    """As the model's pre-norms run under autocast: float32 in, bfloat16 out, no gate."""
    x, weight, _, dout = norm_inputs((2, 100), 768, torch.float32, gated=False, seed=2)
    norm_check(x, weight, None, dout, 768, TOL[torch.bfloat16], out_dtype=torch.bfloat16)


def test_norm_compiled_fullgraph_matches_eager():
    x, weight, z, dout = norm_inputs((2, 64), 512, torch.bfloat16, seed=3)

    def f(x, w, z):
        return cutile_norm(x * 2, w, 1e-5, z, 256, torch.bfloat16) * 3

    leaves = [t.detach().requires_grad_(True) for t in (x, weight, z)]
    eager = torch.autograd.grad(f(*leaves), leaves, dout)
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(*leaves), leaves, dout)
    for e, c in zip(eager, compiled):
        assert rel_err(c, e.to(F64)) < 1e-6


@pytest.mark.parametrize(
    "layers",
    [
        {"conv_backend": "cutile"},
        {"norm_backend": "cutile"},
        {"norm_backend": "cutile", "conv_backend": "cutile"},
        {"norm_backend": "auto", "conv_backend": "auto"},  # cuTile runs here: auto takes both kernels
    ],
)
def test_model_with_cutile_layers_matches_torch_layers(layers):
    cfg = dict(vocab_size=256, d_model=64, n_layer=2, d_state=16, headdim=16, chunk_size=32, ssd_backend="torch")
    torch.manual_seed(0)
    ref_model = Mamba2LM(Mamba2Config(**cfg)).cuda()
    model = Mamba2LM(Mamba2Config(**cfg, **layers)).cuda()
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
