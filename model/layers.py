"""The Mamba-2 block's work around the SSD, written so torch.compile fuses it and eager mode copies nothing.

    split_linear         in_proj: one matmul, its output split into views; the backward adds the parts'
                         gradients into one matmul chain instead of concatenating them first, accumulating
                         in place (addmm_into: no copy of the running sum under compile)
    causal_conv1d_silu   SiLU(causal depthwise conv1d) on (b, l, channels), channels last: shifted
                         multiply-adds, no transposes; one fused kernel (forward and backward) under compile
    rms_norm             RMSNorm over the last dim, optionally gated by SiLU(z) and in groups; one fused
                         kernel under compile
Arithmetic in float32 (float64 for float64 inputs) where it accumulates; outputs in the dtype the next matmul
consumes (under autocast, bf16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def accumulate_dtype(t: Tensor) -> torch.dtype:
    """float32, or float64 for float64 tensors: what sums and normalizations run in."""
    return torch.promote_types(t.dtype, torch.float32)


def compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype matmuls on `t` run in: autocast's where it is enabled on t's device, else t's own."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


@torch.library.custom_op("mamba2_layers::addmm_into", mutates_args=("acc",))
def addmm_into(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b in place. A custom op because Inductor lowers a traced `acc.addmm_(a, b)` (functionalized
    to addmm) to at::addmm_out into a new buffer, which first copies acc into it; a mutating custom op is
    reinplaced onto acc when acc is not read afterwards (here an intermediate of the backward)."""
    acc.addmm_(a, b)


class _SplitLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u: Tensor, weight: Tensor, sizes: list[int], dtype: torch.dtype):
        u_c, w_c = u.to(dtype), weight.to(dtype)
        ctx.save_for_backward(u_c, w_c)
        ctx.sizes, ctx.u_dtype, ctx.w_dtype = sizes, u.dtype, weight.dtype
        return tuple(F.linear(u_c, w_c).split(sizes, dim=-1))

    @staticmethod
    def backward(ctx, *grads: Tensor):
        u_c, w_c = ctx.saved_tensors
        u2 = u_c.reshape(-1, u_c.shape[-1])
        g2 = [g.reshape(-1, g.shape[-1]).to(u_c.dtype) for g in grads]
        du = None
        for g, w in zip(g2, w_c.split(ctx.sizes, dim=0)):
            if du is None:
                du = g @ w
            else:
                addmm_into(du, g, w)
        dw = torch.cat([g.t() @ u2 for g in g2])  # (sum(sizes), d): weight-sized, small
        return du.reshape(u_c.shape).to(ctx.u_dtype), dw.to(ctx.w_dtype), None, None


def split_linear(u: Tensor, weight: Tensor, sizes: list[int]) -> tuple[Tensor, ...]:
    """u (..., d) @ weightᵀ (weight (sum(sizes), d)), split along the last dim into parts of `sizes`.

    Same values as `F.linear(u, weight).split(sizes, -1)` (autocast's dtype where enabled); its backward
    computes du = Σ_i g_i W_i without first concatenating the parts' gradients g_i.
    """
    return _SplitLinear.apply(u, weight, sizes, compute_dtype(u))


def causal_conv1d_silu(x: Tensor, weight: Tensor, bias: Tensor | None, seq_idx: Tensor | None = None) -> Tensor:
    """SiLU(causal depthwise conv1d(x)). x (b, l, c), weight (c, k), bias (c,) -> (b, l, c) in x's dtype.

    y[:, t] = bias + Σ_j weight[:, j] · x[:, t - (k - 1) + j]      (x[:, s] = 0 for s < 0)

    seq_idx: (b, l) integer document ids, non-decreasing along each row, or None. With them the tap reading token s
    for output t counts only if seq_idx[:, s] == seq_idx[:, t]: no output sees a token of another document
    (causal_conv1d's semantics); one mask per shift, no host sync.
    """
    l, k = x.shape[1], weight.shape[-1]
    padded = F.pad(x, (0, 0, k - 1, 0))  # k - 1 zero tokens in front
    taps = [padded[:, j : j + l] for j in range(k)]  # tap j: token t - (k - 1) + j for output t
    if seq_idx is not None:  # zero where the token lies in another document (the last tap reads t itself)
        ids = F.pad(seq_idx, (k - 1, 0))  # the front's ids never matter: its x is zero
        same = [(ids[:, j : j + l] == seq_idx).unsqueeze(-1) for j in range(k - 1)]
        taps = [torch.where(m, tap, 0) for m, tap in zip(same, taps)] + taps[-1:]
    w = weight.to(accumulate_dtype(x))
    y = taps[0] * w[:, 0]
    for j in range(1, k):
        y = y + taps[j] * w[:, j]
    if bias is not None:
        y = y + bias.to(y.dtype)
    return F.silu(y).to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float, z: Tensor | None = None, group_size: int | None = None) -> Tensor:
    """weight · v / rms(v), the rms over groups of `group_size` channels, v = x · SiLU(z) (or x).

    x, z: (..., d); weight: (d,). Returns x's shape in the dtype the next matmul consumes (autocast's
    where enabled, else x's): under bf16 autocast the float32 residual stream is normalized straight
    into bf16, with no separate cast.
    """
    v = x.to(accumulate_dtype(x))
    if z is not None:
        v = v * F.silu(z.to(v.dtype))
    shape = v.shape
    v = v.reshape(*shape[:-1], -1, group_size or shape[-1])
    v = v * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)
    return (v.reshape(shape) * weight.to(v.dtype)).to(compute_dtype(x))
