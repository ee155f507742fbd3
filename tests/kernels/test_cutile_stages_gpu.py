"""Every cuTile stage against its reference stage, forward and backward, on the end-to-end shape grid.

Each stage gets the same inputs as its reference stage (upstream quantities from the float64
reference, rounded as the kernels receive them) and is compared with that stage in float64.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from bench.inputs import rel_err, stage_inputs
from kernels import reference
from kernels import reference_backward as ref_bwd
from kernels.cutile import state_walks, tuning
from kernels.cutile.bwd_dbc import bwd_dbc, dbc_space
from kernels.cutile.bwd_dx import bwd_dx, dx_space
from kernels.cutile.bwd_pass_state import bwd_pass_state
from kernels.cutile.chunk_cumsum import LOG2E, chunk_cumsum, chunk_cumsum_log2
from kernels.cutile.chunk_cumsum_bwd import chunk_cumsum_bwd, search_space
from kernels.cutile.compute_out import compute_out
from kernels.cutile.compute_out import search_space as out_space
from kernels.cutile.fwd_pass_state import fwd_pass_state, states_dtype
from kernels.cutile.fwd_pass_state import search_space as state_space  # chunk_cumsum_bwd's holds the name
from tests.gpu_common import CUTILE, SEEDS, TOL

pytestmark = CUTILE
F64 = torch.float64
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The end-to-end grid: 3 dtypes x chunk 64/128/256 x head dim 64/128 x state 64/128; b 2, h 4, g 2.
GRID = list(itertools.product(DTYPES, (64, 128, 256), (64, 128), (64, 128)))
BACKWARD_GRID = [case for case in GRID if case[1] <= 128]
IDS = lambda v: str(v).replace("torch.", "")


def case(dtype, chunk, p, n, g=2):
    """Inputs (rounded to dtype), their float64 copies, dy and dfinal, and the float64 forward stages."""
    t = stage_inputs(dtype, chunk, p, n, g=g, seed=SEEDS[dtype] + chunk + p + n)
    t64 = {k: None if v is None else v.to(F64) for k, v in t.items()}
    return t, t64, t["dy"], t["dfinal"], t["dt_out"], t["dA_cumsum"], t["chunk_states"], t["final_state"]


def f32(*ts):
    return [t.float() for t in ts]


def expected_states_dtype(dtype):
    """The dtype the chunk states and their gradients must be stored in with `dtype` inputs: bf16 with bf16,
    float32 with fp16 (too narrow a range for states) and fp32."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def stored(dtype, *states):
    """Chunk states / state gradients as fwd_pass_state and bwd_pass_state store them with `dtype` inputs."""
    return [s.to(states_dtype(dtype)) for s in states]


@pytest.mark.parametrize("dtype,chunk,p,n", GRID, ids=IDS)
def test_forward_stages(dtype, chunk, p, n):
    t, t64, _, _, dt_out, dA, states, final = case(dtype, chunk, p, n)
    out, cumsum = chunk_cumsum(t["dt"], t["A"], chunk, t["dt_bias"], True)
    assert out.shape == dt_out.shape and cumsum.shape == dA.shape
    assert rel_err(out, dt_out) < 1e-6 and rel_err(cumsum, dA) < 1e-6
    # the backward's stage 1: the same rows, and dA_cumsum·log2(e) as the float32 product the host would form
    out2, cumsum2, log2 = chunk_cumsum_log2(t["dt"], t["A"], chunk, t["dt_bias"], True)
    assert torch.equal(out2, out) and torch.equal(cumsum2, cumsum)
    torch.testing.assert_close(log2, cumsum * LOG2E, rtol=2**-23, atol=0)
    s, fin = fwd_pass_state(t["x"], t["B"], *f32(dt_out, dA, t64["initial_states"]))
    assert s.dtype == expected_states_dtype(dtype) and fin.dtype == torch.float32
    assert rel_err(s, states) < TOL[dtype] and rel_err(fin, final) < TOL[dtype]
    y = compute_out(t["x"], t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, states), *f32(t64["D"]))
    y64 = reference.compute_out(t64["x"], t64["B"], t64["C"], dt_out, dA, states, t64["D"])
    assert y.dtype == dtype and rel_err(y, y64) < TOL[dtype]


@pytest.mark.parametrize("dtype,chunk,p,n", BACKWARD_GRID, ids=IDS)
def test_backward_stages(dtype, chunk, p, n):
    t, t64, dy, dfinal, dt_out, dA, states, _ = case(dtype, chunk, p, n)
    dy64 = dy.to(F64)
    dstates, dinit = ref_bwd.bwd_pass_state(dy64, t64["C"], dA, dfinal.to(F64))
    got_dstates, got_dinit = bwd_pass_state(dy, t["C"], dA.float(), dfinal)
    assert got_dstates.dtype == expected_states_dtype(dtype) and got_dinit.dtype == torch.float32
    assert rel_err(got_dstates, dstates) < TOL[dtype] and rel_err(got_dinit, dinit) < TOL[dtype]

    want = ref_bwd.bwd_dx(t64["x"], dy64, t64["B"], t64["C"], dt_out, dA, dstates, t64["D"])
    got = bwd_dx(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, dstates), *f32(t64["D"]))
    assert got[0].dtype == dtype and got[3].shape == want[3].shape
    for name, a, b in zip(("dx", "ddt_dir", "da_intra", "dD_parts"), got, want):
        assert rel_err(a, b) < TOL[dtype], name
    # handed the log2 copy the host would form (as chunk_cumsum_log2 writes it), the same results
    log2 = dA.float() * LOG2E
    again = bwd_dx(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, dstates), *f32(t64["D"]), dA_log2=log2)
    assert all(torch.equal(a, b) for a, b in zip(again, got))

    dB, dC, da_inter = ref_bwd.bwd_dbc(t64["x"], dy64, t64["B"], t64["C"], dt_out, dA, states, dstates)
    got = bwd_dbc(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, states, dstates))
    assert got[0].dtype == dtype and got[1].dtype == dtype
    for name, a, b in zip(("dB", "dC", "da_inter"), got, (dB, dC, da_inter)):
        assert rel_err(a, b) < TOL[dtype], name


def cumsum_bwd_case(dt_dtype, l, h, bias, softplus, seed, has_d=True):
    """chunk_cumsum_bwd's inputs and the reference stage's float64 result. The gradients are float32 (b, h, c, Q),
    dt_out in the (b, h, c * Q) layout the other stages give, the raw dt a strided (b, l, h) view (as the model
    slices it from in_proj's output), dD's partial sums (h, b * c) as bwd_dx writes them."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    b, Q = 3, 64
    wide = (torch.randn(b, l, h + 5, generator=gen) * 0.5 - 1.0).to("cuda", dt_dtype)
    dt = wide[..., 2 : 2 + h]
    A = -torch.rand(h, generator=gen).cuda() * 4 - 0.5
    dt_bias = torch.randn(h, generator=gen).cuda() * 0.5 if bias else None
    grads = [torch.randn(b, h, -(-l // Q), Q, generator=gen).cuda() for _ in range(3)]
    dD_parts = torch.randn(h, b * -(-l // Q), generator=gen).cuda() if has_d else None
    bias64 = None if dt_bias is None else dt_bias.double()
    dt_out, _ = reference.chunk_cumsum(dt.double(), A.double(), Q, bias64, softplus)
    dt_out = dt_out.contiguous()
    parts64 = None if dD_parts is None else dD_parts.double()
    want = ref_bwd.chunk_cumsum_bwd(*grads, dt_out, dt.double(), A.double(), softplus, bias64, parts64)
    return (*grads, dt_out.float(), dt, A, softplus, dt_bias, dD_parts), want


@pytest.mark.parametrize("dt_dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("l,h", [(2 * 64 + 37, 4), (256, 6), (100, 24)])
@pytest.mark.parametrize(
    "bias,softplus,has_d", [(True, True, True), (False, True, False), (True, False, False), (False, False, True)]
)
def test_chunk_cumsum_bwd(dt_dtype, l, h, bias, softplus, has_d):
    """The decay and dt gradients through stage 1 against the reference stage in float64: with and without softplus,
    dt_bias and dD's partial sums, short last chunk, a partial head tile (6 heads), ddt written in dt's dtype,
    contiguous; the per-head gradients as one (3, h) float32 tensor whose absent inputs' rows are zero."""
    args, want = cumsum_bwd_case(dt_dtype, l, h, bias, softplus, seed=l + h, has_d=has_d)
    ddt, dheads = chunk_cumsum_bwd(*args)
    assert ddt.dtype == dt_dtype and ddt.shape == (3, l, h) and ddt.is_contiguous()
    assert dheads.dtype == torch.float32 and dheads.shape == (3, h)
    tol = max(1e-5, torch.finfo(dt_dtype).eps)  # fp32 arithmetic; ddt is rounded to dt's dtype once
    assert rel_err(ddt, want[0]) < tol
    for name, a, b, given in zip(("dA", "ddt_bias", "dD"), dheads, want[1], (True, bias, has_d)):
        assert rel_err(a, b) < tol if given else not a.any(), name


@pytest.mark.parametrize("cfg", search_space(24), ids=str)
def test_every_tuning_configuration_of_chunk_cumsum_bwd(cfg):
    args, want = cumsum_bwd_case(torch.bfloat16, 2 * 64 + 37, 24, True, True, seed=7)
    with tuning.forced("chunk_cumsum_bwd", cfg) as launched:
        got = chunk_cumsum_bwd(*args)
    assert launched == [cfg]
    for name, a, b in zip(("ddt", "dheads"), got, want):
        assert rel_err(a, b) < torch.finfo(torch.bfloat16).eps, name


@pytest.mark.parametrize("g", [1, 4])
def test_backward_stages_one_group_and_one_head_per_group(g):
    t, t64, dy, dfinal, dt_out, dA, states, _ = case(torch.float32, 64, 64, 64, g=g)
    dstates, _ = ref_bwd.bwd_pass_state(dy.to(F64), t64["C"], dA, dfinal.to(F64))
    dB, dC, da_inter = ref_bwd.bwd_dbc(t64["x"], dy.to(F64), t64["B"], t64["C"], dt_out, dA, states, dstates)
    got = bwd_dbc(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA, states, dstates))
    for name, a, b in zip(("dB", "dC", "da_inter"), got, (dB, dC, da_inter)):
        assert rel_err(a, b) < TOL[torch.float32], name


TUNED = [("bwd_dbc", cfg) for cfg in dbc_space()] + [("bwd_dx", cfg) for cfg in dx_space()]


@pytest.mark.parametrize("stage,config", TUNED, ids=lambda v: str(v))
def test_every_tuning_configuration_of_the_backward(stage, config):
    """Tuning picks a configuration by speed alone, so each one it can pick must be right: bf16, state 128
    (two column blocks when the configuration splits them), each forced in turn."""
    t, t64, dy, dfinal, dt_out, dA, states, _ = case(torch.bfloat16, 64, 64, 128)
    dstates, _ = ref_bwd.bwd_pass_state(dy.to(F64), t64["C"], dA, dfinal.to(F64))
    with tuning.forced(stage, config) as launched:
        if stage == "bwd_dbc":
            want = ref_bwd.bwd_dbc(t64["x"], dy.to(F64), t64["B"], t64["C"], dt_out, dA, states, dstates)
            got = bwd_dbc(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(torch.bfloat16, states, dstates))
        else:
            want = ref_bwd.bwd_dx(t64["x"], dy.to(F64), t64["B"], t64["C"], dt_out, dA, dstates, t64["D"])
            got = bwd_dx(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(torch.bfloat16, dstates), *f32(t64["D"]))
    assert launched == [config]
    for i, (a, b) in enumerate(zip(got, want)):
        assert rel_err(a, b) < TOL[torch.bfloat16], (stage, config, i)


DX_LOOPS = [(dtype, cfg) for dtype in DTYPES for cfg in dx_space(dtype) if cfg.chunks > 1]


@pytest.mark.parametrize("nchunks", [1, 4, 5, 9])
@pytest.mark.parametrize("dtype,config", DX_LOOPS, ids=IDS)
def test_bwd_dx_taking_several_chunks_a_program(dtype, config, nchunks):
    """Each configuration whose program takes several chunks in turn (2, 4 or 8), forced, in every dtype against the
    float64 stage: 4 chunks (a multiple of 2 and 4), 5 and 9 (the last program takes the last chunk again; 9 gives
    8 chunks a second program) and a single chunk (every step of the loop the same chunk); the last chunk short."""
    chunk = 64
    t = stage_inputs(dtype, chunk, 64, 128, l=nchunks * chunk - 21, seed=SEEDS[dtype] + nchunks)
    t64 = {k: None if v is None else v.to(F64) for k, v in t.items()}
    dt_out, dA, dy, dstates = t["dt_out"], t["dA_cumsum"], t["dy"], t["dstates"]
    want = ref_bwd.bwd_dx(t64["x"], dy.to(F64), t64["B"], t64["C"], dt_out, dA, dstates, t64["D"])
    with tuning.forced("bwd_dx", config) as launched:
        got = bwd_dx(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, dstates), *f32(t64["D"]))
    assert launched == [config]
    for name, a, b in zip(("dx", "ddt_dir", "da_intra", "dD_parts"), got, want):
        assert a.shape == b.shape and rel_err(a, b) < TOL[dtype], name


WALKS = [cfg for cfg in state_space(64, 128, 64) if cfg.chunks_per_step == 2]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("nchunks", [1, 4, 5])
@pytest.mark.parametrize("config", WALKS, ids=str)
def test_forward_walk_taking_two_chunks_an_iteration(config, nchunks, dtype):
    """Each two-chunk configuration tuning can pick, forced, against the float64 stage: an even number of chunks,
    an odd one (the walk's last iteration steps past the end) and a single chunk; the last chunk short."""
    chunk = 64
    t = stage_inputs(dtype, chunk, 64, 128, l=nchunks * chunk - 21, seed=SEEDS[dtype] + nchunks)
    t64 = {k: None if v is None else v.to(F64) for k, v in t.items()}
    with tuning.forced("fwd_pass_state", config) as launched:
        s, fin = fwd_pass_state(t["x"], t["B"], *f32(t["dt_out"], t["dA_cumsum"], t64["initial_states"]))
    assert launched == [config]
    assert s.shape == t["chunk_states"].shape
    assert rel_err(s, t["chunk_states"]) < TOL[dtype] and rel_err(fin, t["final_state"]) < TOL[dtype]


ONE_LAUNCH = [(torch.bfloat16, cfg, 5) for cfg in state_space(64, 128, 64)]
ONE_LAUNCH += [(dtype, cfg, k) for dtype in DTYPES for cfg in WALKS[:1] for k in (1, 4, 5)]


@pytest.mark.parametrize("dtype,config,nchunks", ONE_LAUNCH, ids=IDS)
def test_both_walks_in_one_launch(dtype, config, nchunks):
    """kernels.cutile.state_walks' one launch, each configuration tuning can pick forced (bf16, 5 chunks), and a
    two-chunk one in three dtypes at 1, 4 and 5 chunks (the last short): its chunk states and final state against
    fwd_pass_state's float64 stage, its dstates and initial state's gradient against bwd_pass_state's, with initial
    states and a final state's gradient given."""
    chunk = 64
    t = stage_inputs(dtype, chunk, 64, 128, l=nchunks * chunk - 21, seed=SEEDS[dtype] + 7 * nchunks)
    t64 = {k: None if v is None else v.to(F64) for k, v in t.items()}
    with tuning.forced("state_walks", config) as launched:
        got = state_walks.state_walks(
            t["x"], t["B"], *f32(t["dt_out"], t["dA_cumsum"], t64["initial_states"]), t["dy"], t["C"], t["dfinal"],
            walks="one launch",
        )  # fmt: skip
    assert launched == [config]
    want = (t["chunk_states"], t["final_state"], t["dstates"], t["dinit"])
    for name, a, b in zip(("chunk_states", "final_state", "dstates", "dinitial_states"), got, want, strict=True):
        assert a.shape == b.shape and rel_err(a, b) < TOL[dtype], name
    assert got[0].dtype == got[2].dtype == expected_states_dtype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("config", out_space(128, 64), ids=str)
def test_every_tuning_configuration_of_compute_out(config, dtype):
    """Each compute_out configuration tuning can pick, forced, against the float64 stage: 549 tokens are 5 blocks of
    128 and 9 of 64, so a program taking two blocks in turn meets the sequence's end after its first."""
    chunk = 128
    t = stage_inputs(dtype, chunk, 64, 128, l=4 * chunk + 37, seed=SEEDS[dtype] + 3)
    t64 = {k: None if v is None else v.to(F64) for k, v in t.items()}
    dt_out, dA, states = t["dt_out"], t["dA_cumsum"], t["chunk_states"]
    with tuning.forced("compute_out", config) as launched:
        y = compute_out(t["x"], t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, states), *f32(t64["D"]))
    assert launched == [config]
    y64 = reference.compute_out(t64["x"], t64["B"], t64["C"], dt_out.to(F64), dA.to(F64), states.to(F64), t64["D"])
    assert y.dtype == dtype and rel_err(y, y64) < TOL[dtype]
