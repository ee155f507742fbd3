"""The SSD backward in readable PyTorch, in the passes the cuTile backward kernels implement.

`kernels.reference.ssd_chunked` differentiated by autograd is the specification of the gradients; this
module writes the same gradients in closed form, pass by pass, so each backward kernel can be checked
against one function here, and this module against autograd (tests/kernels/test_reference_backward.py).

Notation as in kernels/reference.py, per (batch, head) and chunk (t, s, j: tokens of one chunk):
    Λ_t = dA_cumsum (natural log, restarts at every chunk), Λ_e its value at the chunk's last token,
    L[t, s] = exp(Λ_t − Λ_s) for s <= t else 0,  CB[t, s] = C_t · B_s,  e_s = exp(Λ_e − Λ_s),
    S_c the state entering chunk c (`chunk_states`), Ĝ_c = dℒ/dS_{c+1} the gradient of the state
    leaving chunk c (`dstates`; for the last chunk, the gradient arriving on the final state).

Passes (after recomputing chunk_cumsum and fwd_pass_state):
    bwd_pass_state    Ĝ_c for every chunk, walking the chunks backwards; d initial_states
    bwd_dx            dx, dD's partial sums, and the parts of ddt that need no chunk state S_c
    bwd_dbc           dB, dC (summed over the heads of a group) and the rest of the decay gradient
    chunk_cumsum_bwd  ddt -> d dt (through softplus); dA, d dt_bias and dD as one (3, h) tensor

The decay gradient da_j = dℒ/d(A dt_j) is summed in the stable form (no term that is later
subtracted): da_j = Σ_{t>=j} Σ_{s<j} R[t,s] + Σ_{s<j} r_s + Σ_{t>=j} q_t + exp(Λ_e) <Ĝ_c, S_c>, with
R = dCB ∘ CB, r_s = dt_s x_s · (e_s Ĝ_c B_s), q_t = dy_t · (exp(Λ_t) S_c C_t).

Document boundaries (`seq_idx`, see kernels/reference.py): every pass takes the forward's masks
(`kernels.reference.document_masks`), which are constants of the differentiation: L[t, s] is 0 across
documents (so are dCB and R), e_s is 0 for tokens outside the chunk's last document (so is r_s),
exp(Λ_t) is 0 in the state read for tokens outside the previous chunk's last document (in the G walk, dC and
q_t), and exp(Λ_e) is 0 where the state is cut at the chunk (in the G walk and the term exp(Λ_e) <Ĝ_c, S_c>).
The decay gradient keeps its stable form with these masked terms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kernels.reference import (
    _decay,
    _heads_from_groups,
    _masked_exp,
    _pad_tokens,
    chunk_cumsum,
    document_masks,
    fwd_pass_state,
)


def _per_chunk(t: Tensor, c: int, Q: int, nheads: int | None = None) -> Tensor:
    """(b, l, k, d) -> (b, c, Q, k, d) zero-padded to whole chunks; groups repeated to `nheads` heads if given."""
    if nheads is not None:
        t = _heads_from_groups(t, nheads)
    b, _, k, d = t.shape
    return _pad_tokens(t, c * Q).reshape(b, c, Q, k, d)


def _chunked_x_dy(x: Tensor, dy: Tensor, dt_out: Tensor) -> tuple[Tensor, Tensor]:
    """x and dy as (b, c, Q, h, p) in the compute dtype of dt_out."""
    _, _, c, Q = dt_out.shape
    return _per_chunk(x.to(dt_out.dtype), c, Q), _per_chunk(dy.to(dt_out.dtype), c, Q)


def _exclusive_cumsum(t: Tensor, dim: int) -> Tensor:
    return torch.cumsum(t, dim) - t


def bwd_pass_state(
    dy: Tensor,
    C: Tensor,
    dA_cumsum: Tensor,
    dfinal_state: Tensor | None = None,
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Gradients of the chunk states, walking the chunks backwards.

    G_c = exp(Λ_e,c) G_{c+1} + Σ_{t in c} exp(Λ_t) dy_t C_tᵀ, starting from G_N = dfinal_state (or 0);
    with seq_idx, exp(Λ_e,c) is 0 where the state is cut at chunk c and exp(Λ_t) is 0 for tokens outside the
    previous chunk's last document.

    Args:
        dy: (b, l, h, p).  C: (b, l, g, n).  dA_cumsum: (b, h, c, Q).  dfinal_state: (b, h, p, n) or None.
        seq_idx: (b, l) int document ids, or None.
    Returns:
        dstates: (b, c, h, p, n), dstates[:, c] = Ĝ_c = G_{c+1}.  dinitial_states: (b, h, p, n) = G_0.
    """
    b, _, h, p = dy.shape
    _, _, c, Q = dA_cumsum.shape
    n = C.shape[-1]
    dtype = dA_cumsum.dtype
    docs = document_masks(seq_idx, Q)
    from_prev, carried = (None, None) if docs is None else (docs.from_prev, docs.carried)
    dyc = _per_chunk(dy.to(dtype), c, Q)
    Cc = _per_chunk(C.to(dtype), c, Q, h)
    direct = torch.einsum("bhcq,bcqhp,bcqhn->bchpn", _masked_exp(dA_cumsum, from_prev), dyc, Cc)
    chunk_decay = _masked_exp(dA_cumsum[..., -1], carried)  # (b, h, c)
    G = dy.new_zeros((b, h, p, n), dtype=dtype) if dfinal_state is None else dfinal_state.to(dtype)
    dstates = []
    for k in reversed(range(c)):
        dstates.append(G)
        G = chunk_decay[:, :, k, None, None] * G + direct[:, k]
    return torch.stack(dstates[::-1], dim=1), G


def bwd_dx(
    x: Tensor,
    dy: Tensor,
    B: Tensor,
    C: Tensor,
    dt_out: Tensor,
    dA_cumsum: Tensor,
    dstates: Tensor,
    D: Tensor | None = None,
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """dx, dD's partial sums and the state-free parts of ddt, per (chunk, head).

    dx̃_s = Σ_{t>=s} CB[t,s] L[t,s] dy_t + e_s Ĝ_c B_s;  dx_s = dt_s dx̃_s + D dy_s;  ddt_dir_s = x_s · dx̃_s.
    With seq_idx, L[t,s] is 0 across documents and e_s is 0 for s outside the chunk's last document.

    Args:
        x, dy: (b, l, h, p).  B, C: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q).
        dstates: (b, c, h, p, n) from `bwd_pass_state`.  D: (h,) or None.
        seq_idx: (b, l) int document ids, or None.
    Returns:
        dx: (b, l, h, p) in the compute dtype.  ddt_dir: (b, h, c, Q).
        da_intra: (b, h, c, Q) the decay gradient's terms Σ_{t>=j} Σ_{s<j} R[t,s] + Σ_{s<j} r_s.
        dD_parts: (h, b·c) the partial sums of dD = Σ dy·x, one per (batch, chunk) at column batch·c + chunk;
        None when D is None.
    """
    b, l, h, p = x.shape
    _, _, c, Q = dt_out.shape
    dtype = dt_out.dtype
    docs = document_masks(seq_idx, Q)
    same, to_last = (None, None) if docs is None else (docs.same, docs.to_last)
    xc, dyc = _chunked_x_dy(x, dy, dt_out)
    Bc, Cc = _per_chunk(B.to(dtype), c, Q, h), _per_chunk(C.to(dtype), c, Q, h)
    L = _decay(dA_cumsum, same)
    CB = torch.einsum("bcthn,bcshn->bhcts", Cc, Bc)
    e = _masked_exp(dA_cumsum[..., -1:] - dA_cumsum, to_last)  # (b, h, c, Q)
    dxt_state = torch.einsum("bhcs,bcshn,bchpn->bcshp", e, Bc, dstates.to(dtype))
    dxt = torch.einsum("bhcts,bcthp->bcshp", CB * L, dyc) + dxt_state
    dt_tok = dt_out.permute(0, 2, 3, 1)[..., None]  # (b, c, Q, h, 1)
    dx = (dt_tok * dxt).reshape(b, c * Q, h, p)[:, :l]
    if D is not None:
        dx = dx + D.to(dtype)[None, None, :, None] * dy.to(dtype)
    ddt_dir = (xc * dxt).sum(-1).permute(0, 3, 1, 2)
    r = dt_out * (xc * dxt_state).sum(-1).permute(0, 3, 1, 2)
    dCB = torch.einsum("bcthp,bcshp->bhcts", dyc, xc) * L * dt_out[..., None, :]
    R = dCB * CB  # R[t, s] = dy_t · (M[t, s] x_s), zero above the diagonal
    straddling = _exclusive_cumsum(R, -1)  # [t, j] = Σ_{s<j} R[t, s]
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    da_intra = straddling.masked_fill(~causal, 0.0).sum(-2) + _exclusive_cumsum(r, -1)
    dD_parts = None if D is None else torch.einsum("bcqhp,bcqhp->hbc", dyc, xc).reshape(h, b * c)
    return dx, ddt_dir, da_intra, dD_parts


def bwd_dbc(
    x: Tensor,
    dy: Tensor,
    B: Tensor,
    C: Tensor,
    dt_out: Tensor,
    dA_cumsum: Tensor,
    chunk_states: Tensor,
    dstates: Tensor,
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dB, dC per group, and the decay gradient's terms that need the chunk state, per (chunk, group).

    dC_t = Σ_heads [Σ_{s<=t} dCB[t,s] B_s + exp(Λ_t) S_cᵀ dy_t],
    dB_s = Σ_heads [Σ_{t>=s} dCB[t,s] C_t + e_s dt_s Ĝ_cᵀ x_s],  dCB[t,s] = (dy_t · x_s) L[t,s] dt_s.
    With seq_idx, L[t,s] is 0 across documents, exp(Λ_t) is 0 for t outside the previous chunk's last
    document, e_s is 0 for s outside the chunk's last document, and exp(Λ_e) is 0 where the state is cut.

    Args:
        x, dy: (b, l, h, p).  B, C: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q).
        chunk_states: (b, c, h, p, n) from `fwd_pass_state`.  dstates: (b, c, h, p, n) from `bwd_pass_state`.
        seq_idx: (b, l) int document ids, or None.
    Returns:
        dB, dC: (b, l, g, n) in the compute dtype.
        da_inter: (b, h, c, Q) the decay gradient's terms Σ_{t>=j} q_t + exp(Λ_e) <Ĝ_c, S_c>.
    """
    b, l, h, _ = x.shape
    _, _, c, Q = dt_out.shape
    g, n = B.shape[-2:]
    r = h // g
    dtype = dt_out.dtype
    docs = document_masks(seq_idx, Q)
    same, to_last, from_prev, carried = (None,) * 4 if docs is None else docs
    xc, dyc = _chunked_x_dy(x, dy, dt_out)
    Bc, Cc = _per_chunk(B.to(dtype), c, Q), _per_chunk(C.to(dtype), c, Q)
    S, G = chunk_states.to(dtype), dstates.to(dtype)
    dCB = torch.einsum("bcthp,bcshp->bhcts", dyc, xc) * _decay(dA_cumsum, same) * dt_out[..., None, :]
    dCB_group = dCB.reshape(b, g, r, c, Q, Q).sum(2)  # C·Bᵀ is shared by the heads of a group
    inter_c = torch.einsum("bcthp,bchpn,bhct->bcthn", dyc, S, _masked_exp(dA_cumsum, from_prev))  # per head
    w = _masked_exp(dA_cumsum[..., -1:] - dA_cumsum, to_last) * dt_out
    state_b = torch.einsum("bcshp,bchpn,bhcs->bcshn", xc, G, w)
    dC = torch.einsum("bgcts,bcsgn->bctgn", dCB_group, Bc) + inter_c.reshape(b, c, Q, g, r, n).sum(4)
    dB = torch.einsum("bgcts,bctgn->bcsgn", dCB_group, Cc) + state_b.reshape(b, c, Q, g, r, n).sum(4)
    q = torch.einsum("bcthn,bcthn->bhct", inter_c, _per_chunk(C.to(dtype), c, Q, h))
    z = _masked_exp(dA_cumsum[..., -1], carried) * torch.einsum("bchpn,bchpn->bhc", G, S)
    da_inter = torch.flip(torch.cumsum(torch.flip(q, [-1]), -1), [-1]) + z[..., None]
    return dB.reshape(b, c * Q, g, n)[:, :l], dC.reshape(b, c * Q, g, n)[:, :l], da_inter


def chunk_cumsum_bwd(
    ddt_dir: Tensor,
    da_intra: Tensor,
    da_inter: Tensor,
    dt_out: Tensor,
    dt: Tensor,
    A: Tensor,
    dt_softplus: bool = False,
    dt_bias: Tensor | None = None,
    dD_parts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The backward of stage 1: from ddt (direct) and da = dℒ/d(A dt) to the gradients of its inputs, with
    the per-head gradients gathered into one tensor.

    da = da_intra + da_inter;  ddt = ddt_dir + A da;  dA = Σ dt da;
    d dt = ddt · softplus'(u) = ddt (1 − exp(−dt)) with softplus.

    Args:
        ddt_dir, da_intra, da_inter, dt_out: (b, h, c, Q).  dt: (b, l, h) the forward's raw dt (tokens past l
        are padding).  A: (h,).  dD_parts: (h, b·c) partial sums of dD (`bwd_dx`'s; any number of
        columns is summed) or None.
    Returns:
        ddt: (b, l, h) gradient of the raw dt.
        dheads: (3, h), the rows dA, d dt_bias, dD; a row is zero when its input is None.
    """
    b, h, c, Q = dt_out.shape
    da = da_intra + da_inter
    ddt = ddt_dir + A.to(da.dtype)[None, :, None, None] * da
    dA = (dt_out * da).sum((0, 2, 3))  # one product and one reduction (an einsum here ran as a batched gemv)
    if dt_softplus:
        ddt = ddt * -torch.expm1(-dt_out)
    ddt = ddt.reshape(b, h, c * Q)[..., : dt.shape[1]].transpose(1, 2)
    dbias = ddt.sum((0, 1)) if dt_bias is not None else torch.zeros_like(dA)
    dD = dD_parts.sum(1).to(dA.dtype) if dD_parts is not None else torch.zeros_like(dA)
    return ddt, torch.stack((dA, dbias, dD))


def state_walks(
    x: Tensor,
    B: Tensor,
    dt_out: Tensor,
    dA_cumsum: Tensor,
    initial_states: Tensor | None,
    dy: Tensor,
    C: Tensor,
    dfinal_state: Tensor | None,
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward's two walks over the chunks, which need nothing of each other: the chunk states and final state
    (fwd_pass_state, recomputed) and the states' gradients and the initial state's (bwd_pass_state)."""
    return (
        *fwd_pass_state(x, B, dt_out, dA_cumsum, initial_states, seq_idx),
        *bwd_pass_state(dy, C, dA_cumsum, dfinal_state, seq_idx),
    )


def ssd_backward(
    dy: Tensor,
    dfinal_state: Tensor | None,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Every gradient of `kernels.reference.ssd_chunked`, pass by pass, the per-head ones in one tensor.
    Shapes as `kernels.ssd`; seq_idx (b, l) int document ids or None, as the forward's.
    `kernels.cutile.ssd.ssd_backward` composes the cuTile passes the same way.

    Returns:
        dx, ddt, dB, dC, dheads, dinitial_states in the compute dtype; dheads (3, h) holds dA, d dt_bias, dD (zero rows
        for absent inputs); dinitial_states is None when initial_states is.
    """
    dt_out, dA_cumsum = chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus)
    walks = state_walks(x, B, dt_out, dA_cumsum, initial_states, dy, C, dfinal_state, seq_idx)
    chunk_states, _, dstates, dinit = walks
    dx, ddt_dir, da_intra, dD_parts = bwd_dx(x, dy, B, C, dt_out, dA_cumsum, dstates, D, seq_idx)
    dB, dC, da_inter = bwd_dbc(x, dy, B, C, dt_out, dA_cumsum, chunk_states, dstates, seq_idx)
    ddt, dheads = chunk_cumsum_bwd(ddt_dir, da_intra, da_inter, dt_out, dt, A, dt_softplus, dt_bias, dD_parts)
    return dx, ddt, dB, dC, dheads, None if initial_states is None else dinit


def by_input(grads: Sequence[Tensor | None], D: Tensor | None = None, dt_bias: Tensor | None = None) -> tuple:
    """`ssd_backward`'s gradients (or the backward op's, the same six) in the order of the SSD's inputs: dx, ddt, dA,
    dB, dC, dD, ddt_bias, dinitial_states; dA, ddt_bias and dD are rows of dheads, dD and ddt_bias None when D and
    dt_bias are."""
    dx, ddt, dB, dC, dheads, dinit = grads
    dA, dbias, dD = dheads.unbind(0)
    return dx, ddt, dA, dB, dC, None if D is None else dD, None if dt_bias is None else dbias, dinit
