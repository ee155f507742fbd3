"""The fused pieces of the step against their plain PyTorch statements, float64 on the CPU: same values,
same gradients; and the chunked loss keeps no logits-sized tensor for its backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.layers import causal_conv1d_silu, rms_norm, split_linear
from model.loss import linear_cross_entropy

TIGHT = dict(rtol=1e-10, atol=1e-12)


def _leaves(*shapes, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def _grads(fn, leaves):
    """fn(*leaves) and the gradients of a fixed random projection of it."""
    out = fn(*leaves)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), leaves, allow_unused=True, materialize_grads=True)
    return out.detach(), grads


def test_split_linear_matches_linear_then_split():
    u, w = _leaves((3, 7, 16), (5 + 9 + 2, 16))

    def fused(u, w):
        return torch.cat(split_linear(u, w, [5, 9, 2]), dim=-1)

    def plain(u, w):
        return torch.cat(F.linear(u, w).split([5, 9, 2], dim=-1), dim=-1)

    (out, grads), (ref, ref_grads) = _grads(fused, [u, w]), _grads(plain, [u, w])
    torch.testing.assert_close(out, ref, **TIGHT)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TIGHT)


def test_split_linear_runs_in_autocast_dtype_and_returns_gradients_in_parameter_dtype():
    u, w = _leaves((2, 4, 8), (6, 8), dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        parts = split_linear(u, w, [2, 4])
    assert all(p.dtype == torch.bfloat16 for p in parts)
    sum(p.float().sum() for p in parts).backward()
    assert u.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


@pytest.mark.parametrize("k", [1, 4])
def test_causal_conv1d_silu_matches_conv1d(k):
    x, w, b = _leaves((2, 11, 6), (6, k), (6,))

    def plain(x, w, b):  # the usual form: channels first, pad k - 1 both sides, keep the first l outputs
        y = F.conv1d(x.transpose(1, 2), w[:, None, :], b, padding=k - 1, groups=x.shape[-1])
        return F.silu(y[..., : x.shape[1]].transpose(1, 2))

    (out, grads), (ref, ref_grads) = _grads(causal_conv1d_silu, [x, w, b]), _grads(plain, [x, w, b])
    torch.testing.assert_close(out, ref, **TIGHT)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TIGHT)


def test_causal_conv1d_is_causal():
    x, w, b = (t.detach() for t in _leaves((1, 9, 3), (3, 4), (3,)))
    changed = x.clone()
    changed[0, 5] += 1.0
    a, c = causal_conv1d_silu(x, w, b), causal_conv1d_silu(changed, w, b)
    torch.testing.assert_close(a[:, :5], c[:, :5], **TIGHT)
    assert not torch.allclose(a[:, 5:9], c[:, 5:9])


# documents of one token, of fewer tokens than the kernel width (4) and of more, per row
DOCUMENTS = [[1, 3, 6, 1, 2], [5, 1, 1, 4, 2]]


def _seq_idx(lengths: list[list[int]]) -> torch.Tensor:
    """Document ids (rows, Σ lengths) int32: 0, 1, ... per row, one a document."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths]).int()


def _conv_separately(lengths: list[list[int]]):
    """The conv of each document on its own, concatenated back: what the packed conv must equal."""

    def conv(x, w, b):
        rows = []
        for r, row in enumerate(lengths):
            ends = torch.tensor(row).cumsum(0).tolist()
            docs = [x[r : r + 1, e - n : e] for e, n in zip(ends, row)]
            rows.append(torch.cat([causal_conv1d_silu(d, w, b) for d in docs], dim=1))
        return torch.cat(rows)

    return conv


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("ids", ["consecutive", "sparse"])  # only equality of ids matters, not their values
def test_causal_conv1d_with_seq_idx_equals_documents_apart(k, ids):
    seq_idx = _seq_idx(DOCUMENTS)
    if ids == "sparse":
        seq_idx = seq_idx * 3 + 7
    x, w, b = _leaves((2, 13, 6), (6, k), (6,))

    def packed(x, w, b):
        return causal_conv1d_silu(x, w, b, seq_idx=seq_idx)

    (out, grads), (ref, ref_grads) = _grads(packed, [x, w, b]), _grads(_conv_separately(DOCUMENTS), [x, w, b])
    torch.testing.assert_close(out, ref, **TIGHT)
    for g, r in zip(grads, ref_grads):  # x, weight, bias
        torch.testing.assert_close(g, r, **TIGHT)


def test_causal_conv1d_with_a_moved_boundary_differs():
    """The check above can fail: the same documents with one boundary a token later do not match them."""
    moved = _seq_idx(DOCUMENTS)
    moved[0, 4] = moved[0, 3]  # row 0's third document (tokens 4..9) now starts at token 5
    x, w, b = _leaves((2, 13, 6), (6, 4), (6,))

    def packed(x, w, b):
        return causal_conv1d_silu(x, w, b, seq_idx=moved)

    (out, grads), (ref, ref_grads) = _grads(packed, [x, w, b]), _grads(_conv_separately(DOCUMENTS), [x, w, b])
    differs = (out - ref).abs().amax(-1) > 1e-6
    assert differs[0].nonzero().flatten().tolist() == [4, 5, 6, 7]  # token 4 and those whose taps reach it
    assert not differs[1].any()
    assert not torch.allclose(grads[0], ref_grads[0])


def test_causal_conv1d_one_document_is_no_seq_idx():
    """One document per row (any id) gives exactly the conv without ids."""
    x, w, b = (t.detach() for t in _leaves((2, 9, 5), (5, 4), (5,)))
    seq_idx = torch.full((2, 9), 3, dtype=torch.int32)
    assert torch.equal(causal_conv1d_silu(x, w, b, seq_idx=seq_idx), causal_conv1d_silu(x, w, b))


def test_causal_conv1d_with_seq_idx_traces_in_one_graph():
    """torch.compile traces the masked conv whole (no graph break, no host sync) to the same values."""
    x, w, b = (t.detach() for t in _leaves((2, 13, 6), (6, 4), (6,)))
    seq_idx = _seq_idx(DOCUMENTS)
    compiled = torch.compile(causal_conv1d_silu, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, w, b, seq_idx=seq_idx), causal_conv1d_silu(x, w, b, seq_idx), **TIGHT)


@pytest.mark.parametrize("gated,group_size", [(False, None), (True, None), (True, 4)])
def test_rms_norm_matches_its_formula(gated, group_size):
    x, z, w = _leaves((2, 5, 8), (2, 5, 8), (8,))

    def fused(x, z, w):
        return rms_norm(x, w, 1e-5, z if gated else None, group_size)

    def plain(x, z, w):
        v = x * F.silu(z) if gated else x
        gs = group_size or 8
        groups = v.reshape(2, 5, 8 // gs, gs)
        rms = groups.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
        return (groups / rms).reshape(2, 5, 8) * w

    (out, grads), (ref, ref_grads) = _grads(fused, [x, z, w]), _grads(plain, [x, z, w])
    torch.testing.assert_close(out, ref, **TIGHT)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TIGHT)


@pytest.mark.parametrize("chunk", [1, 7, 23, 64])
def test_linear_cross_entropy_matches_full_logits(chunk):
    h, w = _leaves((23, 16), (50, 16))
    y = torch.randint(0, 50, (23,), generator=torch.Generator().manual_seed(2))
    loss = linear_cross_entropy(h, w, y, chunk)
    ref = F.cross_entropy(F.linear(h, w), y)
    torch.testing.assert_close(loss, ref, **TIGHT)
    grads = torch.autograd.grad(3.0 * loss, [h, w])
    ref_grads = torch.autograd.grad(3.0 * ref, [h, w])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TIGHT)
    with torch.no_grad():  # evaluation takes the gradient-free path: same value
        torch.testing.assert_close(linear_cross_entropy(h, w, y, chunk), ref.detach(), **TIGHT)


def test_linear_cross_entropy_keeps_no_logits_for_backward():
    n, vocab, d, chunk = 64, 1000, 8, 16
    h, w = _leaves((n, d), (vocab, d), dtype=torch.float32)
    y = torch.randint(0, vocab, (n,))
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        linear_cross_entropy(h, w, y, chunk).backward()
    assert saved and max(saved) <= vocab * d  # dW at most; never n x vocab (64000) logits
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        F.cross_entropy(F.linear(h, w), y).backward()
    assert max(saved) >= n * vocab  # the plain form does keep them: the check can tell


def test_linear_cross_entropy_under_autocast_matches_plain_form():
    h, w = _leaves((40, 32), (300, 32), dtype=torch.float32)
    y = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, y, 16)
        ref = F.cross_entropy(F.linear(h, w).float(), y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)  # same bf16 logits, same float32 softmax
    grads = torch.autograd.grad(loss, [h, w])
    ref_grads = torch.autograd.grad(ref, [h, w])
    for g, r in zip(grads, ref_grads):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-4)  # bf16 gradient matmuls on both sides
