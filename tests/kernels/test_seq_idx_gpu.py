"""Document boundaries (seq_idx) in the cuTile SSD on a GPU: every stage against its float64 reference stage with
seq_idx, the composed forward and backward (every gradient) against float64 autograd through the reference and the
token recurrence, and against mamba_ssm's Triton kernels where they are installed.

Boundaries fall inside chunks, on chunk edges (the forward's and the backward's, BACKWARD_CHUNK), around one-token
documents, at a row's last token, and a row may start past document 0 (its initial state then reaches nothing).
Most cases share the kernels' compile-time constants (4 heads in 2 groups, head and state dim 64, chunk 64 or 128)
and differ in run-time data (boundaries, batch, length), so the file's builds stay few (about a hundred kernel
builds on a cold compile cache, which dominate its time; a few seconds warm); each edge case changes one constant in
one dtype. Tolerances are relative Frobenius errors per input dtype (tests.gpu_common.TOL).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor

import kernels
from bench.inputs import random_inputs, rel_err, stage_inputs
from kernels import reference
from kernels import reference_backward as ref_bwd
from kernels.cutile import state_walks, tuning
from kernels.cutile.bwd_dbc import DbcConfig, bwd_dbc
from kernels.cutile.bwd_dx import DxConfig, bwd_dx
from kernels.cutile.bwd_pass_state import bwd_pass_state
from kernels.cutile.compute_out import OutConfig, compute_out
from kernels.cutile.fwd_pass_state import StateConfig, fwd_pass_state, states_dtype
from kernels.cutile.launch import BACKWARD_CHUNK
from kernels.cutile.ssd import ssd_cutile
from tests.gpu_common import CUTILE, INPUTS, SEEDS, TOL

pytestmark = CUTILE
F64 = torch.float64
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PATTERNS = ("random", "chunk_edges", "one_token", "late_start")
IDS = lambda v: str(v).replace("torch.", "")


def document_ids(pattern: str, b: int, l: int, chunk: int, seed: int) -> Tensor:
    """seq_idx (b, l) int32 on the GPU, non-decreasing along each row, its boundaries laid out by `pattern`:
        random       a boundary about every 24 tokens, at random; odd rows end in a one-token document
        chunk_edges  a boundary at every edge of min(chunk, BACKWARD_CHUNK) tokens (the forward's and the backward's
                     chunk edges), and at every other edge one-token documents on both sides of it
        one_token    the first 12 tokens one-token documents, then pairs of one-token documents at random
        late_start   as random, and even rows start at document 3: their initial state reaches nothing
        single       no boundary: one document
    Row r's ids grow by r + 1 at each boundary (ids need not be consecutive)."""
    rng = random.Random(seed)
    edge = min(chunk, BACKWARD_CHUNK)
    rows = []
    for r in range(b):
        starts: set[int] = set()
        if pattern in ("random", "late_start"):
            starts |= set(rng.sample(range(1, l), k=l // 24)) | ({l - 1} if r % 2 else set())
        elif pattern == "chunk_edges":
            for i, e in enumerate(range(edge, l, edge)):
                starts |= {e - 1, e, e + 1} if i % 2 == 0 else {e}
        elif pattern == "one_token":
            starts |= set(range(1, min(l, 13)))
            for s in rng.sample(range(13, max(13, l - 1)), k=max(0, l - 14) // 20):
                starts |= {s, s + 1}
        elif pattern != "single":
            raise ValueError(f"unknown pattern {pattern!r}")
        marks = torch.zeros(l, dtype=torch.int64)
        marks[sorted(s for s in starts if 0 < s < l)] = 1
        first = 3 if pattern == "late_start" and r % 2 == 0 else 0
        rows.append(first + (r + 1) * torch.cumsum(marks, 0))
    return torch.stack(rows).to("cuda", torch.int32)


def f32(*ts: Tensor | None) -> list[Tensor | None]:
    return [None if t is None else t.float() for t in ts]


def stored(dtype: torch.dtype, *states: Tensor) -> list[Tensor]:
    """Chunk states / state gradients as fwd_pass_state and bwd_pass_state store them with `dtype` inputs."""
    return [s.to(states_dtype(dtype)) for s in states]


def stage_case(dtype: torch.dtype, chunk: int, pattern: str, seed: int, p: int = 64, n: int = 64) -> tuple[dict, dict]:
    """bench.inputs.stage_inputs' inputs (rounded to dtype; l = 2·chunk + 37, b 2, h 4 in 2 groups, head dim p, state n) with
    seq_idx, the upstream quantities recomputed with it by the float64 reference stages (chunk_states, final_state,
    dstates, dinit), and the float64 copies of the inputs."""
    t = stage_inputs(dtype, chunk, p, n, seed=seed)
    b, l = t["x"].shape[:2]
    t["seq_idx"] = seq_idx = document_ids(pattern, b, l, chunk, seed)
    t64 = {k: None if v is None else v.to(F64) for k, v in t.items() if k != "seq_idx"}
    dA = t["dA_cumsum"]
    states, final = reference.fwd_pass_state(t64["x"], t64["B"], t["dt_out"], dA, t64["initial_states"], seq_idx)
    dstates, dinit = ref_bwd.bwd_pass_state(t64["dy"], t64["C"], dA, t64["dfinal"], seq_idx)
    t.update(chunk_states=states, final_state=final, dstates=dstates, dinit=dinit)
    return t, t64


FORWARD_STAGES = [(dtype, chunk) for dtype in DTYPES for chunk in (64, 128)] + [(torch.bfloat16, 256)]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype,chunk", FORWARD_STAGES, ids=IDS)
def test_forward_stages(dtype, chunk, pattern):
    """fwd_pass_state (its default walk: two chunks an iteration with bf16, one otherwise; 3 chunks, so a two-chunk
    walk steps past the end) and compute_out (with fp16/fp32 inputs and chunk 128 two token blocks a chunk, with bf16
    two blocks a program) against the reference stages with seq_idx, which change the results by several
    tolerances."""
    t, t64 = stage_case(dtype, chunk, pattern, seed=SEEDS[dtype] + chunk)
    seq_idx, dt_out, dA = t["seq_idx"], t["dt_out"], t["dA_cumsum"]
    states, final = t["chunk_states"], t["final_state"]
    got_states, got_final = fwd_pass_state(t["x"], t["B"], *f32(dt_out, dA, t64["initial_states"]), seq_idx)
    assert rel_err(got_states, states) < TOL[dtype] and rel_err(got_final, final) < TOL[dtype]
    D = t64["D"] * 0.05  # D x small beside the terms the masks act on (so a mask left out would fail the test)
    y = compute_out(t["x"], t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, states), *f32(D), seq_idx)
    y64 = reference.compute_out(t64["x"], t64["B"], t64["C"], dt_out, dA, states, D, seq_idx)
    assert y.dtype == dtype and rel_err(y, y64) < TOL[dtype]
    unmasked = reference.fwd_pass_state(t64["x"], t64["B"], dt_out, dA, t64["initial_states"])[0]
    y_unmasked = reference.compute_out(t64["x"], t64["B"], t64["C"], dt_out, dA, unmasked, D)
    assert rel_err(y_unmasked, y64) > 3 * TOL[dtype]  # the boundaries matter


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_backward_stages(dtype, pattern):
    """bwd_pass_state, bwd_dx, bwd_dbc and both walks in one launch, at the backward's chunk size, against the
    reference passes with seq_idx (each given the float64 upstream quantities, rounded as the kernels receive them)."""
    chunk = BACKWARD_CHUNK
    t, t64 = stage_case(dtype, chunk, pattern, seed=SEEDS[dtype] + 7)
    seq_idx, dt_out, dA, dy = t["seq_idx"], t["dt_out"], t["dA_cumsum"], t["dy"]
    states, dstates = t["chunk_states"], t["dstates"]
    got = bwd_pass_state(dy, t["C"], dA.float(), t["dfinal"], seq_idx)
    for name, a, b in zip(("dstates", "dinitial_states"), got, (dstates, t["dinit"]), strict=True):
        assert rel_err(a, b) < TOL[dtype], name

    want = ref_bwd.bwd_dx(t64["x"], t64["dy"], t64["B"], t64["C"], dt_out, dA, dstates, t64["D"], seq_idx)
    got = bwd_dx(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, dstates), *f32(t64["D"]), seq_idx)
    for name, a, b in zip(("dx", "ddt_dir", "da_intra", "dD_parts"), got, want, strict=True):
        assert rel_err(a, b) < TOL[dtype], name

    want = ref_bwd.bwd_dbc(t64["x"], t64["dy"], t64["B"], t64["C"], dt_out, dA, states, dstates, seq_idx)
    got = bwd_dbc(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, states, dstates), seq_idx)
    for name, a, b in zip(("dB", "dC", "da_inter"), got, want, strict=True):
        assert rel_err(a, b) < TOL[dtype], name

    walked = state_walks.state_walks(
        t["x"], t["B"], *f32(dt_out, dA, t64["initial_states"]), dy, t["C"], t["dfinal"], seq_idx, walks="one launch"
    )
    want = (states, t["final_state"], dstates, t["dinit"])
    for name, a, b in zip(("chunk_states", "final_state", "dstates", "dinitial_states"), walked, want, strict=True):
        assert a.shape == b.shape and rel_err(a, b) < TOL[dtype], name


SHIPPED = json.loads((Path(tuning.__file__).parent / "tuned.json").read_text())
CONFIGS = {"fwd_pass_state": StateConfig, "compute_out": OutConfig, "state_walks": StateConfig}
CONFIGS |= {"bwd_dx": DxConfig, "bwd_dbc": DbcConfig}
# one case per (stage, key, configuration): GPUs whose searches chose alike share it
WITH_SEQ_IDX = {(k.split("|")[0], k.split("|")[1], json.dumps(v["config"], sort_keys=True)) for k, v in SHIPPED.items()}
WITH_SEQ_IDX = [(s, key, json.loads(c)) for s, key, c in sorted(WITH_SEQ_IDX) if s in CONFIGS and "_seq_idx" in key]


def run_stage(stage: str, t: dict, t64: dict, dtype: torch.dtype) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """(what the cuTile stage `stage` gives, what its float64 reference stage gives) on stage_case's inputs, seq_idx
    included."""
    seq_idx, dt_out, dA, dy = t["seq_idx"], t["dt_out"], t["dA_cumsum"], t["dy"]
    states, dstates = t["chunk_states"], t["dstates"]
    if stage == "fwd_pass_state":
        got = fwd_pass_state(t["x"], t["B"], *f32(dt_out, dA, t64["initial_states"]), seq_idx)
        return got, (states, t["final_state"])
    if stage == "compute_out":
        D = t64["D"] * 0.05
        got = compute_out(t["x"], t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, states), *f32(D), seq_idx)
        return (got,), (reference.compute_out(t64["x"], t64["B"], t64["C"], dt_out, dA, states, D, seq_idx),)
    if stage == "state_walks":
        args = (t["x"], t["B"], *f32(dt_out, dA, t64["initial_states"]), dy, t["C"], t["dfinal"], seq_idx)
        return state_walks.state_walks(*args, walks="one launch"), (states, t["final_state"], dstates, t["dinit"])
    if stage == "bwd_dx":
        want = ref_bwd.bwd_dx(t64["x"], t64["dy"], t64["B"], t64["C"], dt_out, dA, dstates, t64["D"], seq_idx)
        got = bwd_dx(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, dstates), *f32(t64["D"]), seq_idx)
        return got, want
    want = ref_bwd.bwd_dbc(t64["x"], t64["dy"], t64["B"], t64["C"], dt_out, dA, states, dstates, seq_idx)
    return bwd_dbc(t["x"], dy, t["B"], t["C"], *f32(dt_out, dA), *stored(dtype, states, dstates), seq_idx), want


@pytest.mark.parametrize("pattern", ("random", "chunk_edges"))
@pytest.mark.parametrize("stage,key,config", WITH_SEQ_IDX, ids=str)
def test_shipped_configurations_with_seq_idx(stage, key, config, pattern):
    """Each configuration the shipped table holds for a build with document boundaries (kernels/cutile/tuned.json,
    "_seq_idx" keys: tuned apart, so other block sizes than the build without them), forced at its key's head dim,
    state dim and chunk in bf16, against the float64 reference stage with seq_idx."""
    p, n, chunk = (int(re.search(rf"_{field}(\d+)", key)[1]) for field in ("p", "n", "Q"))
    t, t64 = stage_case(torch.bfloat16, chunk, pattern, seed=SEEDS[torch.bfloat16] + chunk + n, p=p, n=n)
    cfg = CONFIGS[stage](**config)
    with tuning.forced(stage, cfg) as launched:
        got, want = run_stage(stage, t, t64, torch.bfloat16)
    assert launched == [cfg]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape and rel_err(a, b) < TOL[torch.bfloat16], (stage, i)


def outputs_and_gradients(
    fn: Callable[[dict], tuple[Tensor, Tensor]], inputs: dict, dy: Tensor, dfinal: Tensor | None, dtype=None
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """y, the final state and the gradient of Σ dy·y (+ <dfinal, final state>) for every present input, fn taking the
    inputs as leaves (cast to `dtype` first if given)."""
    leaves = {}
    for k, v in inputs.items():
        leaves[k] = None if v is None else (v if dtype is None else v.to(dtype)).detach().requires_grad_()
    y, final = fn(leaves)
    loss = (y * dy.to(y.dtype)).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal.to(final.dtype)).sum()
    loss.backward()
    return y.detach(), final.detach(), {k: v.grad for k, v in leaves.items() if v is not None}


def cutile(chunk: int, seq_idx: Tensor | None, backward: str = "cutile") -> Callable[[dict], tuple[Tensor, Tensor]]:
    """The cutile backend's entry (kernels.cutile.ssd.ssd_cutile, as kernels.ssd calls it), softplus on."""

    def fn(t: dict) -> tuple[Tensor, Tensor]:
        args = (t["x"], t["dt"], t["A"], t["B"], t["C"], chunk, t["D"], t["dt_bias"], True, t["initial_states"])
        return ssd_cutile(*args, seq_idx, backward)

    return fn


def chunked_reference(chunk: int, seq_idx: Tensor) -> Callable[[dict], tuple[Tensor, Tensor]]:
    def fn(t: dict) -> tuple[Tensor, Tensor]:
        args = (t["x"], t["dt"], t["A"], t["B"], t["C"], chunk, t["D"], t["dt_bias"], True, t["initial_states"])
        return reference.ssd_chunked(*args, seq_idx)

    return fn


def check(b, l, h, p, g, n, chunk, dtype, pattern, init=True, dfinal=True, optional=True, seed=0):
    """The cuTile forward and backward with seq_idx against the float64 oracles on the same (rounded) inputs: y and
    the final state against the token recurrence and the chunked reference, every gradient against autograd through
    the chunked reference.

    At one token (l = 1) a gradient of B or C is one dot product over the head dim, with cancellation and nothing to
    average: the float32 kernels' dB there is 9.3e-3 off float64 with or without seq_idx (H200, this seed), so that
    case is held to the bfloat16 tolerance."""
    inputs = random_inputs(b, l, h, p, g, n, dtype, seed=seed, device="cuda", init=init, D=optional, dt_bias=optional)
    seq_idx = document_ids(pattern, b, l, chunk, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    dy = torch.randn(b, l, h, p, generator=gen).to("cuda", dtype)
    dS = torch.randn(b, h, p, n, generator=gen).cuda() if dfinal else None
    y, final, grads = outputs_and_gradients(cutile(chunk, seq_idx), inputs, dy, dS)
    y64, final64, grads64 = outputs_and_gradients(chunked_reference(chunk, seq_idx), inputs, dy, dS, F64)
    keys = ("x", "dt", "A", "B", "C", "D", "dt_bias")
    y_rec, final_rec = reference.ssd_recurrent(*(inputs[k] for k in keys), True, inputs["initial_states"], seq_idx)
    assert y.dtype == dtype and final.dtype == torch.float32
    assert rel_err(y, y_rec) < TOL[dtype] and rel_err(final, final_rec) < TOL[dtype]
    assert rel_err(y64, y_rec) < 1e-10 and rel_err(final64, final_rec) < 1e-10  # the two oracles agree
    for name in INPUTS:
        if inputs[name] is None:
            assert name not in grads
            continue
        got = grads[name]
        assert got.dtype == inputs[name].dtype and got.shape == inputs[name].shape, name
        tol = TOL[dtype] if l > 1 else max(TOL[dtype], TOL[torch.bfloat16])
        assert rel_err(got, grads64[name]) < tol, f"d{name} vs float64"


# 3 dtypes x chunk 64/128 x 4 boundary patterns = 24 on one shape (b 2, h 4, g 2, p = n = 64, l = 2 chunk + 37), with
# and without initial states and a final state's gradient; 9 more lengths of that shape; 8 edges, each changing one
# compile-time constant of it in one dtype. 41 configurations. Lengths are odd where they can be: a launch specializes
# on its strides' divisors, so an odd l keeps one build of each kernel (seq_idx's row stride is l).
GRID = [
    (dtype, chunk, pattern, init)
    for dtype in DTYPES
    for chunk in (64, 128)
    for pattern, init in zip(PATTERNS, (True, True, False, True), strict=True)
]


@pytest.mark.parametrize("dtype,chunk,pattern,init", GRID, ids=IDS)
def test_grid(dtype, chunk, pattern, init):
    seed = SEEDS[dtype] + chunk + len(pattern)
    check(2, 2 * chunk + 37, 4, 64, 2, 64, chunk, dtype, pattern, init=init, dfinal=pattern != "late_start", seed=seed)


LENGTHS = [  # (b, l, pattern): one token of document 3 (its initial state unread), under one chunk, five chunks
    (1, 1, "late_start"),
    (3, 63, "one_token"),
    (3, 5 * 64 + 5, "chunk_edges"),
]


@pytest.mark.parametrize("b,l,pattern", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_lengths(b, l, pattern, dtype):
    check(b, l, 4, 64, 2, 64, 64, dtype, pattern, dfinal=l > 1, seed=SEEDS[dtype] + l)


EDGES = [  # (dtype, b, l, h, p, g, n, chunk, pattern, optional)
    (torch.bfloat16, 2, 293, 4, 64, 2, 64, 256, "random", True),  # forward chunk 256, backward 64
    (torch.bfloat16, 2, 101, 4, 64, 2, 64, 32, "chunk_edges", True),  # backward chunk 32
    (torch.float32, 1, 77, 4, 64, 2, 64, 16, "one_token", True),  # backward chunk 16
    (torch.bfloat16, 2, 165, 4, 64, 1, 64, 64, "random", True),  # one group
    (torch.float32, 2, 165, 4, 64, 4, 64, 64, "chunk_edges", True),  # a group per head
    (torch.float16, 2, 165, 4, 32, 2, 128, 64, "random", True),  # head dim 32, state 128
    (torch.bfloat16, 2, 293, 4, 64, 2, 64, 128, "late_start", False),  # no D, dt_bias or initial states
    (torch.bfloat16, 2, 256, 4, 64, 2, 64, 128, "chunk_edges", True),  # l a multiple of the chunk
]


@pytest.mark.parametrize("dtype,b,l,h,p,g,n,chunk,pattern,optional", EDGES, ids=IDS)
def test_edges(dtype, b, l, h, p, g, n, chunk, pattern, optional):
    check(b, l, h, p, g, n, chunk, dtype, pattern, init=optional, optional=optional, seed=l * 31 + n)


def test_one_document_is_no_boundary():
    """seq_idx all zeros (every mask true) gives the results without seq_idx: outputs and every gradient."""
    b, l, chunk, dtype = 2, 165, 64, torch.bfloat16
    inputs = random_inputs(b, l, 4, 64, 2, 64, dtype, seed=SEEDS[dtype] + 1, device="cuda", init=True)
    gen = torch.Generator().manual_seed(2)
    dy, dS = torch.randn(b, l, 4, 64, generator=gen).to("cuda", dtype), torch.randn(b, 4, 64, 64, generator=gen).cuda()
    single = outputs_and_gradients(cutile(chunk, document_ids("single", b, l, chunk, 0)), inputs, dy, dS)
    plain = outputs_and_gradients(cutile(chunk, None), inputs, dy, dS)
    assert rel_err(single[0], plain[0]) < TOL[dtype] / 10 and rel_err(single[1], plain[1]) < TOL[dtype] / 10
    for name, g in plain[2].items():
        assert rel_err(single[2][name], g) < TOL[dtype] / 10, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_reference_backward_with_seq_idx(dtype):
    """backward="reference" (autograd through kernels.reference.ssd_chunked, the design this project measures) gets
    seq_idx too: its gradients equal the cuTile backward's."""
    b, l, chunk = 2, 165, 64
    inputs = random_inputs(b, l, 4, 64, 2, 64, dtype, seed=SEEDS[dtype] + 2, device="cuda", init=True)
    seq_idx = document_ids("random", b, l, chunk, 3)
    gen = torch.Generator().manual_seed(3)
    dy, dS = torch.randn(b, l, 4, 64, generator=gen).to("cuda", dtype), torch.randn(b, 4, 64, 64, generator=gen).cuda()
    _, _, by_kernels = outputs_and_gradients(cutile(chunk, seq_idx), inputs, dy, dS)
    _, _, by_reference = outputs_and_gradients(cutile(chunk, seq_idx, "reference"), inputs, dy, dS)
    for name, g in by_reference.items():
        assert rel_err(by_kernels[name], g) < TOL[dtype], name


def test_seq_idx_on_another_device_is_refused():
    inputs = random_inputs(1, 64, 2, 64, 1, 64, torch.bfloat16, seed=1, device="cuda")
    with pytest.raises(ValueError, match="seq_idx is on cpu"):
        cutile(64, torch.zeros(1, 64, dtype=torch.int32))(inputs)


def test_matches_mamba_ssm_triton_with_seq_idx():
    """Boundaries on chunk edges and inside chunks, initial states and a final state's gradient: the cuTile forward
    and backward give what mamba_ssm's Triton kernels give with the same seq_idx (kernels.ssd's triton backend),
    outputs and every gradient (the grid's shape in bf16, chunk 128)."""
    reason = kernels.unavailable_reason("triton", "cuda")
    if reason is not None:
        pytest.skip(reason)
    b, l, h, p, g, n, chunk = 2, 293, 4, 64, 2, 64, 128
    inputs = random_inputs(b, l, h, p, g, n, torch.bfloat16, seed=13, device="cuda", init=True)
    seq_idx = document_ids("chunk_edges", b, l, chunk, 5)
    seq_idx[1] = document_ids("random", 1, l, chunk, 6)[0]
    gen = torch.Generator().manual_seed(4)
    dy = torch.randn(b, l, h, p, generator=gen).to("cuda", torch.bfloat16)
    dS = torch.randn(b, h, p, n, generator=gen).cuda()

    def triton(t: dict) -> tuple[Tensor, Tensor]:
        args = (t["x"], t["dt"], t["A"], t["B"], t["C"], chunk, t["D"])
        return kernels.ssd(*args, dt_bias=t["dt_bias"], dt_softplus=True, initial_states=t["initial_states"],
                           seq_idx=seq_idx, return_final_states=True, backend="triton")  # fmt: skip

    ours = outputs_and_gradients(cutile(chunk, seq_idx), inputs, dy, dS)
    theirs = outputs_and_gradients(triton, inputs, dy, dS)
    tol = TOL[torch.bfloat16]  # each side's error against float64 is about a third of it
    assert rel_err(ours[0], theirs[0]) < tol and rel_err(ours[1], theirs[1]) < tol
    for name, g in theirs[2].items():
        assert rel_err(ours[2][name], g) < 2 * tol, name
