"""Document boundaries (seq_idx) in the reference SSD and its closed-form backward, in float64 on CPU.

The specification: a row of packed documents gives what the documents give run one by one (the row's initial
state going to document 0 only), in outputs, final state and every gradient. Checked for the chunked forward
(autograd), the token recurrence with seq_idx (autograd) and the closed-form backward, each against the
documents run alone through the recurrence without seq_idx.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from bench.inputs import random_inputs
from kernels import reference
from kernels import reference_backward as ref_bwd

F64 = torch.float64
NAMES = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")
TOKENWISE = ("x", "dt", "B", "C")
TOL = dict(rtol=1e-10, atol=1e-10)

# name: (document lengths per row, chunk, (h, g), flags); row r numbers its documents 0, r + 1, 2(r + 1), ...
CASES = {
    "one_token_documents": ([[1] * 6 + [10] + [1] * 4, [1, 19]], 8, (4, 2), {}),
    "documents_of_one_chunk": ([[8, 8, 8], [8, 16]], 8, (4, 2), {}),
    "documents_inside_one_chunk": ([[4, 11, 15], [30]], 64, (4, 2), {}),
    "crossing_chunk_edges": ([[5, 7, 9, 3, 6], [13, 17]], 8, (4, 2), {}),
    "spanning_many_chunks": ([[3, 41, 2], [46]], 8, (4, 1), {}),
    "boundaries_on_chunk_edges": ([[8, 5, 3, 16, 1], [16, 8, 9]], 8, (4, 2), {}),
    "short_last_chunk": ([[20, 17], [36, 1]], 16, (4, 2), {}),
    "groups_of_three_heads": ([[7, 10, 14], [15, 16]], 8, (6, 2), {}),
    "no_softplus_or_optional_inputs": ([[9, 12, 4], [2, 23]], 8, (4, 2), dict(softplus=False, optional=False)),
}


def seq_idx_of(lengths: list[list[int]]) -> Tensor:
    """(b, l) int32: row r gives its k-th document the id k (r + 1) (ids need not be consecutive)."""
    rows = [
        torch.repeat_interleave(torch.arange(len(row)) * (r + 1), torch.tensor(row)) for r, row in enumerate(lengths)
    ]
    return torch.stack(rows).to(torch.int32)


def make_inputs(b: int, l: int, hg: tuple[int, int], flags: dict, seed: int) -> dict:
    h, g = hg
    optional = flags.get("optional", True)
    t = random_inputs(b, l, h, 3, g, 4, F64, seed=seed, D=optional, dt_bias=optional, init=optional)
    if not flags.get("softplus", True):
        t["dt"] = t["dt"].abs() * 0.3
    gen = torch.Generator().manual_seed(seed + 1)
    t["dy"] = torch.randn(b, l, h, 3, generator=gen, dtype=F64)
    t["dfinal"] = torch.randn(b, h, 3, 4, generator=gen, dtype=F64)
    return t


def chunked(t: dict, seq_idx: Tensor | None, chunk: int, softplus: bool) -> tuple[Tensor, Tensor]:
    args = (t[k] for k in NAMES[:5])
    return reference.ssd_chunked(*args, chunk, t["D"], t["dt_bias"], softplus, t["initial_states"], seq_idx)


def recurrent(t: dict, seq_idx: Tensor | None, chunk: int, softplus: bool) -> tuple[Tensor, Tensor]:
    args = (t[k] for k in NAMES[:5])
    return reference.ssd_recurrent(*args, t["D"], t["dt_bias"], softplus, t["initial_states"], seq_idx)


def separate(t: dict, seq_idx: Tensor, chunk: int, softplus: bool) -> tuple[Tensor, Tensor]:
    """Every document of every row run alone through the recurrence (no seq_idx); a row's initial state goes to
    its first document only when that document's id is 0. Returns the outputs in place and each row's last
    document's final state."""
    ys, finals = [], []
    for row in range(seq_idx.shape[0]):
        ids, counts = torch.unique_consecutive(seq_idx[row], return_counts=True)
        row_ys, start = [], 0
        for doc, count in zip(ids.tolist(), counts.tolist()):
            piece = {k: t[k][row : row + 1, start : start + count] if k in TOKENWISE else t[k] for k in NAMES}
            init = t["initial_states"]
            piece["initial_states"] = init[row : row + 1] if init is not None and doc == 0 and start == 0 else None
            y, final = recurrent(piece, None, chunk, softplus)
            row_ys.append(y)
            start += count
        ys.append(torch.cat(row_ys, dim=1))
        finals.append(final)
    return torch.cat(ys), torch.cat(finals)


Run = Callable[[dict, Tensor | None, int, bool], tuple[Tensor, Tensor]]


def outputs_and_grads(run: Run, t: dict, seq_idx: Tensor, chunk: int, softplus: bool) -> dict:
    """y, final state and the gradient of ℒ = Σ dy·y + <dfinal, final> for every present input, by autograd."""
    leaves = {k: None if t[k] is None else t[k].clone().requires_grad_(True) for k in NAMES}
    y, final = run(leaves, seq_idx, chunk, softplus)
    loss = (y * t["dy"]).sum() + (final * t["dfinal"]).sum()
    present = [k for k in NAMES if leaves[k] is not None]
    grads = torch.autograd.grad(loss, [leaves[k] for k in present], allow_unused=True)
    out = {k: torch.zeros_like(t[k]) if grad is None else grad for k, grad in zip(present, grads)}
    return dict(out, y=y.detach(), final=final.detach())


def closed_form_grads(t: dict, seq_idx: Tensor, chunk: int, softplus: bool) -> dict:
    """The gradients of `outputs_and_grads` from kernels.reference_backward.ssd_backward."""
    got = ref_bwd.ssd_backward(t["dy"], t["dfinal"], *(t[k] for k in NAMES[:5]), chunk, t["D"], t["dt_bias"],
                               softplus, t["initial_states"], seq_idx)  # fmt: skip
    return {k: g for k, g in zip(NAMES, ref_bwd.by_input(got, t["D"], t["dt_bias"])) if g is not None}


def assert_same(got: dict, expected: dict) -> None:
    assert set(got) <= set(expected)
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], **TOL, msg=name)


@pytest.mark.parametrize("case", CASES)
def test_packed_documents_equal_separate_documents(case):
    lengths, chunk, hg, flags = CASES[case]
    softplus = flags.get("softplus", True)
    seq_idx = seq_idx_of(lengths)
    b, l = seq_idx.shape
    t = make_inputs(b, l, hg, flags, seed=sum(map(len, lengths)) + chunk)
    expected = outputs_and_grads(separate, t, seq_idx, chunk, softplus)
    assert_same(outputs_and_grads(chunked, t, seq_idx, chunk, softplus), expected)
    assert_same(outputs_and_grads(recurrent, t, seq_idx, chunk, softplus), expected)
    assert_same(closed_form_grads(t, seq_idx, chunk, softplus), expected)


def test_a_shifted_boundary_breaks_the_equality():
    """The comparison above can fail: moving one boundary by one token changes y and the gradients (all but
    dD = Σ dy·x, which does not depend on the boundaries)."""
    lengths, chunk, hg, _ = CASES["crossing_chunk_edges"]
    seq_idx = seq_idx_of(lengths)
    t = make_inputs(*seq_idx.shape, hg, {}, seed=5)
    expected = outputs_and_grads(separate, t, seq_idx, chunk, True)
    shifted = seq_idx.clone()
    shifted[0, 12] = shifted[0, 11]  # document 1 of row 0 takes the first token of document 2
    for got in (
        outputs_and_grads(chunked, t, shifted, chunk, True),
        outputs_and_grads(recurrent, t, shifted, chunk, True),
        closed_form_grads(t, shifted, chunk, True),
    ):
        for name in ("y", "x", "dt", "A", "B", "C", "dt_bias"):
            if name in got:
                assert not torch.allclose(got[name], expected[name], **TOL), name


def test_initial_state_belongs_to_document_zero_only():
    """A row starting at seq_idx 1 ignores the initial state (same outputs as without one, zero gradient); a row
    starting at 0 uses it until its first boundary."""
    seq_idx = torch.tensor([[0] * 5 + [1] * 20, [1] * 12 + [2] * 13], dtype=torch.int32)
    t = make_inputs(2, 25, (4, 2), {}, seed=11)
    without = dict(t, initial_states=torch.zeros_like(t["initial_states"]))
    for run in (chunked, recurrent):
        got = outputs_and_grads(run, t, seq_idx, 8, True)
        y_without, final_without = run(without, seq_idx, 8, True)
        torch.testing.assert_close(got["y"][1], y_without[1], **TOL)
        torch.testing.assert_close(got["y"][0, 5:], y_without[0, 5:], **TOL)
        assert not torch.allclose(got["y"][0, :5], y_without[0, :5])
        torch.testing.assert_close(got["final"], final_without, **TOL)
        assert (got["initial_states"][1] == 0).all()
        assert got["initial_states"][0].abs().max() > 1e-3
    dinit = closed_form_grads(t, seq_idx, 8, True)["initial_states"]
    assert (dinit[1] == 0).all() and dinit[0].abs().max() > 1e-3


@pytest.mark.parametrize("case", ["one_token_documents", "boundaries_on_chunk_edges", "short_last_chunk"])
def test_each_pass_equals_autograd_through_the_stages(case):
    """Autograd through fwd_pass_state and compute_out, with dt_out and dA_cumsum as leaves, against each pass:
    bwd_pass_state's d initial_states, bwd_dx's dx, ddt_dir and dD partial sums, bwd_dbc's dB and dC, and
    da_intra + da_inter = the reverse cumulative sum of dℒ/dΛ along the chunk."""
    lengths, chunk, hg, _ = CASES[case]
    seq_idx = seq_idx_of(lengths)
    b, l = seq_idx.shape
    t = make_inputs(b, l, hg, {}, seed=3)
    dt_out, dA_cumsum = reference.chunk_cumsum(t["dt"], t["A"], chunk, t["dt_bias"], True)
    leaves = {k: t[k].clone().requires_grad_(True) for k in ("x", "B", "C", "D", "initial_states")}
    leaves["dt_out"], leaves["dA_cumsum"] = dt_out.clone().requires_grad_(True), dA_cumsum.clone().requires_grad_(True)
    x, B, C = leaves["x"], leaves["B"], leaves["C"]
    states, final = reference.fwd_pass_state(
        x, B, leaves["dt_out"], leaves["dA_cumsum"], leaves["initial_states"], seq_idx
    )
    y = reference.compute_out(x, B, C, leaves["dt_out"], leaves["dA_cumsum"], states, leaves["D"], seq_idx)
    loss = (y * t["dy"]).sum() + (final * t["dfinal"]).sum()
    expected = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    walks = ref_bwd.state_walks(
        t["x"], t["B"], dt_out, dA_cumsum, t["initial_states"], t["dy"], t["C"], t["dfinal"], seq_idx
    )
    chunk_states, _, dstates, dinit = walks
    dx, ddt_dir, da_intra, dD_parts = ref_bwd.bwd_dx(
        t["x"], t["dy"], t["B"], t["C"], dt_out, dA_cumsum, dstates, t["D"], seq_idx
    )
    dB, dC, da_inter = ref_bwd.bwd_dbc(
        t["x"], t["dy"], t["B"], t["C"], dt_out, dA_cumsum, chunk_states, dstates, seq_idx
    )
    da_expected = torch.flip(torch.cumsum(torch.flip(expected["dA_cumsum"], [-1]), -1), [-1])
    torch.testing.assert_close(dinit, expected["initial_states"], **TOL)
    torch.testing.assert_close(dx, expected["x"], **TOL)
    torch.testing.assert_close(ddt_dir, expected["dt_out"], **TOL)
    torch.testing.assert_close(dD_parts.sum(1), expected["D"], **TOL)
    torch.testing.assert_close(dB, expected["B"], **TOL)
    torch.testing.assert_close(dC, expected["C"], **TOL)
    torch.testing.assert_close(da_intra + da_inter, da_expected, **TOL)


def test_no_seq_idx_is_bitwise_the_default_path():
    t = make_inputs(2, 37, (4, 2), {}, seed=2)
    args = [t[k] for k in NAMES[:5]]
    rest = (t["D"], t["dt_bias"], True, t["initial_states"])
    pairs = [
        (reference.ssd_chunked(*args, 8, *rest), reference.ssd_chunked(*args, 8, *rest, None)),
        (reference.ssd_recurrent(*args, *rest), reference.ssd_recurrent(*args, *rest, None)),
        (
            ref_bwd.ssd_backward(t["dy"], t["dfinal"], *args, 8, *rest),
            ref_bwd.ssd_backward(t["dy"], t["dfinal"], *args, 8, *rest, None),
        ),
    ]
    for default, explicit in pairs:
        assert all(torch.equal(a, e) for a, e in zip(default, explicit, strict=True))


def test_one_document_per_row_equals_no_seq_idx():
    """seq_idx all zeros (one document, the initial state's) computes what seq_idx None does."""
    t = make_inputs(2, 37, (4, 2), {}, seed=4)
    zeros = torch.zeros(2, 37, dtype=torch.int32)
    assert_same(outputs_and_grads(chunked, t, zeros, 8, True), outputs_and_grads(chunked, t, None, 8, True))
    assert_same(closed_form_grads(t, zeros, 8, True), outputs_and_grads(chunked, t, None, 8, True))


def test_chunk_seq_idx_pads_with_the_last_value():
    seq_idx = torch.tensor([[0, 0, 1, 1, 1, 2, 2], [3, 3, 3, 3, 4, 4, 4]], dtype=torch.int32)
    tokens, last, prev = reference.chunk_seq_idx(seq_idx, 4)
    assert tokens.tolist() == [[[0, 0, 1, 1], [1, 2, 2, 2]], [[3, 3, 3, 3], [4, 4, 4, 4]]]
    assert last.tolist() == [[1, 2], [3, 4]]
    assert prev.tolist() == [[0, 1], [0, 3]]


def test_strong_decay_in_float32_stays_finite_and_close():
    """Strong decay with boundaries in float32 (A scaled by 20): every gradient is finite (the masks fill −inf
    before exp, never inf · 0), and the closed form's are close to float64's on the same (rounded) inputs."""
    seq_idx = seq_idx_of([[3, 40, 1, 26], [64, 6]])
    t = make_inputs(2, 70, (4, 2), {}, seed=8)
    t["A"] = t["A"] * 20.0
    t32 = {k: None if v is None else v.float() for k, v in t.items()}
    expected = closed_form_grads({k: None if v is None else v.double() for k, v in t32.items()}, seq_idx, 64, True)
    autograd32 = outputs_and_grads(chunked, t32, seq_idx, 64, True)
    closed32 = closed_form_grads(t32, seq_idx, 64, True)
    for name, grad in expected.items():
        assert torch.isfinite(autograd32[name]).all() and torch.isfinite(closed32[name]).all(), name
        assert ((closed32[name].double() - grad).norm() / grad.norm()) < 2e-5, name
