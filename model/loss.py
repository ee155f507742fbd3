"""Cross-entropy through the LM head without materializing the logits of the whole batch.

    loss = mean_t [ logsumexp(h_t Wᵀ) - (h_t Wᵀ)[y_t] ]        h (N, d), W (vocab, d), y (N,)

The tokens are taken `chunk` at a time: a chunk's logits (chunk x vocab, float32 for the softmax)
exist only while it is processed. Where gradients are needed, the forward also forms the chunk's
gradient of the logits, softmax - onehot(y), and keeps only what it contributes to dh (N, d) and
dW (vocab, d); the backward then only scales them. Same matmuls as logits + F.cross_entropy
(3 per chunk), peak memory one chunk of logits instead of N x vocab floats.
"""

from __future__ import annotations

import torch
from torch import Tensor

from model.layers import accumulate_dtype, compute_dtype


def _chunk_logits(h: Tensor, w: Tensor, start: int, chunk: int) -> Tensor:
    """Logits of tokens start .. start + chunk, in float32 (float64 for float64 inputs)."""
    return (h[start : start + chunk] @ w.t()).to(accumulate_dtype(h))


def _chunk_nll(logits: Tensor, lse: Tensor, y: Tensor) -> Tensor:
    return (lse - logits.gather(1, y[:, None]).squeeze(1)).sum()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, chunk: int, dtype: torch.dtype) -> Tensor:
        n = h.shape[0]
        h_c, w_c = h.to(dtype), weight.to(dtype)
        acc = accumulate_dtype(h_c)
        total = h.new_zeros((), dtype=acc)
        dh_parts, dw = [], torch.zeros(weight.shape, dtype=acc, device=weight.device)
        for start in range(0, n, chunk):
            y = targets[start : start + chunk]
            logits = _chunk_logits(h_c, w_c, start, chunk)
            lse = torch.logsumexp(logits, dim=-1)
            total = total + _chunk_nll(logits, lse, y)
            g = torch.exp(logits - lse[:, None])  # softmax
            g.scatter_add_(1, y[:, None], torch.full_like(lse[:, None], -1.0))  # - onehot(y)
            g = (g / n).to(dtype)
            dh_parts.append(g @ w_c)
            dw = dw + (g.t() @ h_c[start : start + chunk]).to(acc)
        ctx.save_for_backward(torch.cat(dh_parts).to(h.dtype), dw.to(weight.dtype))
        return total / n

    @staticmethod
    def backward(ctx, grad: Tensor):
        dh, dw = ctx.saved_tensors
        return dh * grad, dw * grad, None, None, None


def linear_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, chunk: int) -> Tensor:
    """Mean cross-entropy of logits h @ weightᵀ against `targets`, `chunk` tokens at a time.

    h: (N, d); weight: (vocab, d); targets: (N,) int64. Returns a float32 scalar (float64 for float64
    inputs). The matmuls run in
    autocast's dtype where it is enabled (as F.linear would), the softmax in float32.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
    dtype = compute_dtype(h)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, chunk, dtype)
    h_c, w_c = h.to(dtype), weight.to(dtype)
    total = h.new_zeros((), dtype=accumulate_dtype(h_c))
    for start in range(0, h.shape[0], chunk):
        logits = _chunk_logits(h_c, w_c, start, chunk)
        total = total + _chunk_nll(logits, torch.logsumexp(logits, dim=-1), targets[start : start + chunk])
    return total / h.shape[0]
