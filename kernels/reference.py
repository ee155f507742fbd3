"""The Mamba-2 SSD in readable PyTorch: the specification every other backend is checked against.

Notation (the same in every backend):
    b batch, l tokens, h heads, p head dim, g groups (h % g == 0), n state dim,
    Q chunk size, c = ceil(l / Q) chunks.
    x (b, l, h, p), dt (b, l, h), A (h,), B and C (b, l, g, n), D (h,), state (b, h, p, n).
Head i reads group i // (h // g) of B and C.

The recurrence (one step per token):
    h_t = exp(dt_t * A) * h_{t-1} + dt_t * x_t B_tᵀ        (p, n) per head
    y_t = h_t C_t + D * x_t

The chunked form computes the same thing in three stages, named as the cuTile kernels are:
    chunk_cumsum    dA_cumsum = cumulative sum of dt * A inside each chunk (restarts at every chunk)
    fwd_pass_state  each chunk's contribution to the state, then a sequential pass over chunks giving
                    the state entering every chunk and the final state
    compute_out     y = (C Bᵀ ∘ decay ∘ causal mask) (dt x)  +  decay · C (state entering the chunk)  +  D x

All arithmetic is float32 (or float64 when the inputs are float64); `ssd_chunked` returns y in x's dtype.
Tokens past l (padding up to a whole chunk) get dt = 0: no decay, no contribution, outputs discarded.

Document boundaries (mamba_ssm's `seq_idx`): seq_idx (b, l) int, non-decreasing along each row, packs
several documents into a row. The recurrence becomes h_t = [seq_idx_t == seq_idx_{t-1}] exp(dt_t A) h_{t-1}
+ dt_t x_t B_tᵀ with seq_idx_{-1} = 0: no state crosses a boundary, and the initial state belongs to
document 0 only. In the chunked form (dA_cumsum is not reset) an intra-chunk pair counts only inside one
document; a chunk adds to the state only the tokens of its last token's document; the state entering a
chunk survives the chunk only if the chunk ends in the previous chunk's last document, and reaches only that
document's tokens (`document_masks`). Padding repeats each row's last seq_idx. seq_idx None is one document
per row, computed exactly as without boundaries.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def _compute_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _pad_tokens(t: Tensor, length: int) -> Tensor:
    """Zero-pad dim 1 (tokens) of t up to `length`."""
    pad = length - t.shape[1]
    if pad == 0:
        return t
    shape = list(t.shape)
    shape[1] = pad
    return torch.cat([t, t.new_zeros(shape)], dim=1)


def _heads_from_groups(t: Tensor, nheads: int) -> Tensor:
    """(..., g, n) -> (..., h, n): head i reads group i // (h // g)."""
    return t.repeat_interleave(nheads // t.shape[-2], dim=-2)


def process_dt(dt: Tensor, dt_bias: Tensor | None = None, dt_softplus: bool = False) -> Tensor:
    """dt (..., h) -> dt + dt_bias, through softplus when asked, in float32/64."""
    dt = dt.to(_compute_dtype(dt))
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    return dt


def chunk_cumsum(
    dt: Tensor,
    A: Tensor,
    chunk_size: int,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[Tensor, Tensor]:
    """Stage 1: per-chunk cumulative sum of dt * A.

    Args:
        dt: (b, l, h) raw time steps.
        A: (h,) negative decay rates.
    Returns:
        dt_out: (b, h, c, Q) processed dt (bias, softplus), 0 on padding tokens.
        dA_cumsum: (b, h, c, Q) cumulative sum of dt_out * A along each chunk (natural log units).
    """
    b, l, h = dt.shape
    c = -(-l // chunk_size)
    dt = _pad_tokens(process_dt(dt, dt_bias, dt_softplus), c * chunk_size)
    dt_out = dt.reshape(b, c, chunk_size, h).permute(0, 3, 1, 2)
    dA_cumsum = torch.cumsum(dt_out * A.to(dt.dtype)[None, :, None, None], dim=-1)
    return dt_out, dA_cumsum


def pad_seq_idx(seq_idx: Tensor, multiple: int) -> Tensor:
    """seq_idx (b, l) padded to (b, ceil(l / multiple) · multiple) by repeating each row's last value (padding
    tokens join the last document); seq_idx itself when l is a multiple already."""
    b, l = seq_idx.shape
    extra = -l % multiple
    return seq_idx if extra == 0 else torch.cat([seq_idx, seq_idx[:, -1:].expand(b, extra)], dim=1)


def chunk_seq_idx(seq_idx: Tensor, chunk_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """seq_idx by chunk: per token, at each chunk's last token, and at the previous chunk's last token.

    Args:
        seq_idx: (b, l) int, non-decreasing along each row.
    Returns:
        tokens: (b, c, Q) padded to whole chunks by repeating each row's last value.
        last: (b, c) at each chunk's last token (the last real token l − 1 for a short last chunk).
        prev: (b, c) at the previous chunk's last token; 0 for chunk 0 (the initial state's document).
    """
    b = seq_idx.shape[0]
    tokens = pad_seq_idx(seq_idx, chunk_size).reshape(b, -1, chunk_size)
    last = tokens[..., -1]
    prev = F.pad(last[:, :-1], (1, 0))
    return tokens, last, prev


class DocumentMasks(NamedTuple):
    """Where a term of the chunked SSD counts (True) under document boundaries, laid out as dA_cumsum
    (b, h, c, Q) with the head axis broadcast (size 1).

    same: (b, 1, c, Q, Q), [t, s]: tokens t and s belong to one document (intra-chunk pairs).
    to_last: (b, 1, c, Q), token s belongs to its chunk's last document (it adds to the chunk's state).
    from_prev: (b, 1, c, Q), token t belongs to the previous chunk's last document (it reads the state
        entering its chunk).
    carried: (b, 1, c), the chunk ends in the previous chunk's last document (the state entering the chunk
        survives into the state leaving it).
    """

    same: Tensor
    to_last: Tensor
    from_prev: Tensor
    carried: Tensor


def document_masks(seq_idx: Tensor | None, chunk_size: int) -> DocumentMasks | None:
    """The masks of `DocumentMasks` for seq_idx (b, l); None when seq_idx is None (no boundaries)."""
    if seq_idx is None:
        return None
    tokens, last, prev = chunk_seq_idx(seq_idx, chunk_size)
    return DocumentMasks(
        same=(tokens[..., :, None] == tokens[..., None, :])[:, None],
        to_last=(tokens == last[..., None])[:, None],
        from_prev=(tokens == prev[..., None])[:, None],
        carried=(last == prev)[:, None],
    )


def _masked_exp(log: Tensor, keep: Tensor | None) -> Tensor:
    """exp(log) where keep (broadcast to log), 0 elsewhere, masked before the exponential; exp(log) when
    keep is None."""
    if keep is None:
        return torch.exp(log)
    return torch.exp(log.masked_fill(~keep, float("-inf")))


def _decay(dA_cumsum: Tensor, same: Tensor | None = None) -> Tensor:
    """(..., Q) -> (..., Q, Q) with [t, s] = exp(Λ_t − Λ_s) for s <= t, 0 above the diagonal, and 0 where
    `same` (broadcast to (..., Q, Q)) is False.

    Masked before the exponential: above the diagonal Λ_t − Λ_s > 0 could overflow.
    """
    Q = dA_cumsum.shape[-1]
    keep = torch.ones(Q, Q, dtype=torch.bool, device=dA_cumsum.device).tril()
    if same is not None:
        keep = keep & same
    diff = dA_cumsum[..., :, None] - dA_cumsum[..., None, :]
    return torch.exp(diff.masked_fill(~keep, float("-inf")))


def _segsum(a: Tensor) -> Tensor:
    """(..., T) -> (..., T, T) with [k, j] = a_{j+1} + ... + a_k for j <= k, and -inf above the diagonal.

    Summed as masked cumulative sums, not as differences of one cumulative sum, so no cancellation.
    """
    T = a.shape[-1]
    x = a[..., :, None].expand(*a.shape, T)  # x[..., i, j] = a_i
    below = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)
    s = torch.cumsum(x.masked_fill(~below, 0.0), dim=-2)
    return s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=a.device).tril(), float("-inf"))


def fwd_pass_state(
    x: Tensor,
    B: Tensor,
    dt_out: Tensor,
    dA_cumsum: Tensor,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Stage 2: the state entering every chunk, and the final state.

    The pass over chunks is the recurrence S_{k+1} = exp(G_end,k) S_k + added_k, S_0 = initial state.
    It is evaluated here in closed form, S_k = sum_{j<k} exp(G_end,j+1 + ... + G_end,k-1) added_j
    + exp(G_end,0 + ... + G_end,k-1) S_0, as one product with a (c+1) x (c+1) decay matrix, which
    autograd differentiates in a few large kernels instead of 2c small ones (the cuTile kernel
    walks the chunks in order instead). With seq_idx, added_k counts only the tokens of chunk k's last
    document, and G_end,k is −inf (the state is cut) where chunk k does not end in chunk k−1's last document.

    Args:
        x: (b, l, h, p).  B: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q) from `chunk_cumsum`.
        initial_states: (b, h, p, n) state before the first token, zeros when None.
        seq_idx: (b, l) int document ids, non-decreasing along each row, or None.
    Returns:
        chunk_states: (b, c, h, p, n) the state before each chunk's first token.
        final_state: (b, h, p, n) the state after the last token.
    """
    b, _, h, p = x.shape
    _, _, c, Q = dt_out.shape
    g, n = B.shape[-2:]
    r = h // g
    dtype = dt_out.dtype
    docs = document_masks(seq_idx, Q)
    xc = _pad_tokens(x.to(dtype), c * Q).reshape(b, c, Q, g, r, p)
    Bc = _pad_tokens(B.to(dtype), c * Q).reshape(b, c, Q, g, n)
    # What each chunk's tokens add to the state by the chunk's end: sum_s exp(G_end - G_s) dt_s x_s B_sᵀ.
    to_end = _masked_exp(dA_cumsum[..., -1:] - dA_cumsum, None if docs is None else docs.to_last)
    weight = (to_end * dt_out).reshape(b, g, r, c, Q)
    added = torch.einsum("bgrcs,bcsgrp,bcsgn->bcgrpn", weight, xc, Bc).reshape(b, c, h, p, n)
    if initial_states is None:
        initial_states = x.new_zeros((b, h, p, n), dtype=dtype)
    states = torch.cat([initial_states.to(dtype)[:, None], added], dim=1)  # (b, c + 1, h, p, n)
    chunk_log_decay = F.pad(dA_cumsum[..., -1], (1, 0))  # (b, h, c + 1), a leading 0 for S_0
    if docs is not None:
        cut = F.pad(~docs.carried, (1, 0))  # (b, 1, c + 1), aligned with chunk_log_decay
        chunk_log_decay = chunk_log_decay.masked_fill(cut, float("-inf"))
    decay = torch.exp(_segsum(chunk_log_decay))  # (b, h, c + 1, c + 1)
    passed = torch.einsum("bhkj,bjhpn->bkhpn", decay, states)
    return passed[:, :c], passed[:, c]


def compute_out(
    x: Tensor,
    B: Tensor,
    C: Tensor,
    dt_out: Tensor,
    dA_cumsum: Tensor,
    chunk_states: Tensor,
    D: Tensor | None = None,
    seq_idx: Tensor | None = None,
) -> Tensor:
    """Stage 3: every token's output.

    y_t = sum_{s <= t in t's chunk} (C_t · B_s) exp(G_t - G_s) dt_s x_s  +  exp(G_t) C_t · S_chunk  +  D x_t

    With seq_idx, the first sum runs over s of t's document, and the second term is kept only if t belongs
    to the previous chunk's last document.

    Args:
        x: (b, l, h, p).  B, C: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q).
        chunk_states: (b, c, h, p, n) from `fwd_pass_state`.  D: (h,) or None.
        seq_idx: (b, l) int document ids, non-decreasing along each row, or None.
    Returns:
        y: (b, l, h, p) in the compute dtype (float32/64).
    """
    b, l, h, p = x.shape
    _, _, c, Q = dt_out.shape
    g, n = C.shape[-2:]
    r = h // g
    dtype = dt_out.dtype
    xc = _pad_tokens(x.to(dtype), c * Q).reshape(b, c, Q, g, r, p)
    Cc = _pad_tokens(C.to(dtype), c * Q).reshape(b, c, Q, g, n)
    Bc = _pad_tokens(B.to(dtype), c * Q).reshape(b, c, Q, g, n)
    G = dA_cumsum.reshape(b, g, r, c, Q)
    docs = document_masks(seq_idx, Q)
    same, from_prev = (None, None) if docs is None else (docs.same[:, None], docs.from_prev[:, None])
    # Intra-chunk: C·Bᵀ per group (shared by its heads), the pairwise decay and the causal mask per head.
    CB = torch.einsum("bctgn,bcsgn->bgcts", Cc, Bc)[:, :, None]  # (b, g, 1, c, t, s)
    scores = CB * _decay(G, same) * dt_out.reshape(b, g, r, c, 1, Q)
    y = torch.einsum("bgrcts,bcsgrp->bctgrp", scores, xc)
    # Inter-chunk: the state entering the chunk, decayed to token t and read by C_t.
    states = chunk_states.reshape(b, c, g, r, p, n)
    y = y + torch.einsum("bctgn,bcgrpn,bgrct->bctgrp", Cc, states, _masked_exp(G, from_prev))
    y = y.reshape(b, c * Q, h, p)[:, :l]
    if D is not None:
        y = y + D.to(dtype)[None, None, :, None] * x.to(dtype)
    return y


def ssd_chunked(
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
) -> tuple[Tensor, Tensor]:
    """The three stages composed. Differentiable by autograd in every input (seq_idx is not differentiable).

    Args:
        seq_idx: (b, l) int document ids, non-decreasing along each row, or None (one document per row).
    Returns:
        y: (b, l, h, p) in x's dtype.  final_state: (b, h, p, n) in float32 (float64 for float64 x), the state
        after the last token (of the row's last document).
    """
    dt_out, dA_cumsum = chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus)
    chunk_states, final_state = fwd_pass_state(x, B, dt_out, dA_cumsum, initial_states, seq_idx)
    y = compute_out(x, B, C, dt_out, dA_cumsum, chunk_states, D, seq_idx)
    return y.to(x.dtype), final_state


def ssd_step(
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One token of the recurrence, dt already processed (bias, softplus).

    Args:
        state: (b, h, p, n).  x: (b, h, p).  dt: (b, h).  A: (h,).  B, C: (b, g, n).  D: (h,) or None.
    Returns:
        y: (b, h, p) and the new state (b, h, p, n), in state's dtype.
    """
    dtype = state.dtype
    h = x.shape[1]
    dt = dt.to(dtype)
    Bh = _heads_from_groups(B.to(dtype), h)
    Ch = _heads_from_groups(C.to(dtype), h)
    decay = torch.exp(dt * A.to(dtype))[..., None, None]
    state = decay * state + (dt[..., None] * x.to(dtype))[..., :, None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", state, Ch)
    if D is not None:
        y = y + D.to(dtype)[None, :, None] * x.to(dtype)
    return y, state


def ssd_recurrent(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The oracle: the recurrence one token at a time, in float64.

    With seq_idx (b, l) the state is reset to zero before every token whose seq_idx differs from the previous
    token's (seq_idx_{-1} = 0, so the initial state reaches document 0 only).

    Returns:
        y: (b, l, h, p) float64.  final_state: (b, h, p, n) float64.
    """
    f64 = torch.float64
    b, l, h, p = x.shape
    n = B.shape[-1]
    dt = process_dt(dt.to(f64), None if dt_bias is None else dt_bias.to(f64), dt_softplus)
    if initial_states is None:
        state = torch.zeros(b, h, p, n, dtype=f64, device=x.device)
    else:
        state = initial_states.to(f64)
    A, Dd = A.to(f64), None if D is None else D.to(f64)
    if seq_idx is not None:
        previous = F.pad(seq_idx[:, :-1], (1, 0))
        kept = (seq_idx == previous).to(f64)[..., None, None, None]  # (b, l, 1, 1, 1)
    ys = []
    for t in range(l):
        if seq_idx is not None:
            state = state * kept[:, t]
        y, state = ssd_step(state, x[:, t].to(f64), dt[:, t], A, B[:, t].to(f64), C[:, t].to(f64), Dd)
        ys.append(y)
    return torch.stack(ys, dim=1), state
