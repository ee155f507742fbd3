"""The cuTile SSD as a differentiable PyTorch op.

Forward: the three cuTile kernels (`kernels.cutile.forward.ssd_forward`); only the inputs are saved.
Backward: recompute the forward through the reference SSD (`kernels.reference.ssd_chunked`) under
autograd and differentiate it, giving gradients for x, dt, A, B, C, D, dt_bias and initial_states.

`ssd_fwd` is the cutile backend of `kernels.ssd`. Both directions are `torch.library.custom_op`s with fake implementations and an autograd
registration, so `torch.compile(model, fullgraph=True)` traces through them as single nodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import reference
from kernels.cutile.forward import ssd_forward


@torch.library.custom_op("mamba2_cutile::ssd_fwd", mutates_args=(), device_types="cuda")
def ssd_fwd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None,
    dt_bias: Tensor | None,
    dt_softplus: bool,
    initial_states: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """cuTile forward: y (b, l, h, p) in x's dtype, final_state (b, h, p, n) float32."""
    return ssd_forward(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states)


@ssd_fwd.register_fake
def _ssd_fwd_fake(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states):
    b, _, h, p = x.shape
    n = B.shape[-1]
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((b, h, p, n), dtype=torch.float32)


_AUTOGRAD_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.ADInplaceOrView
)


@torch.library.custom_op("mamba2_cutile::ssd_bwd", mutates_args=())
def ssd_bwd(
    dy: Tensor,
    dfinal: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None,
    dt_bias: Tensor | None,
    dt_softplus: bool,
    initial_states: Tensor | None,
) -> list[Tensor]:
    """Gradients [dx, ddt, dA, dB, dC, dD, ddt_bias, dinitial_states] by differentiating the reference.

    An absent optional input gets an empty tensor in its place.
    """
    inputs = [x, dt, A, B, C, D, dt_bias, initial_states]
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in inputs]
    # A custom op's body runs below the autograd dispatch keys; let autograd record the recomputation.
    excluded = torch._C._dispatch_tls_local_exclude_set() - _AUTOGRAD_KEYS
    autograd_on = torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)
    with autograd_on, torch.enable_grad(), torch.autocast(x.device.type, enabled=False):
        lx, ldt, lA, lB, lC, lD, lbias, linit = leaves
        y, final = reference.ssd_chunked(lx, ldt, lA, lB, lC, chunk_size, lD, lbias, dt_softplus, linit)
        present = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad((y, final), present, (dy.to(y.dtype), dfinal), allow_unused=True))
    out = []
    for t in leaves:
        if t is None:
            out.append(x.new_empty(0))
            continue
        gt = next(grads)
        # Contiguous, as the fake implementation promises (autograd accepts any layout).
        out.append(torch.zeros(t.shape, dtype=t.dtype, device=t.device) if gt is None else gt.contiguous())
    return out


@ssd_bwd.register_fake
def _ssd_bwd_fake(dy, dfinal, x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states):
    inputs = [x, dt, A, B, C, D, dt_bias, initial_states]
    return [x.new_empty(0) if t is None else t.new_empty(t.shape) for t in inputs]


def _setup_context(ctx, inputs, output) -> None:
    x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states = inputs
    ctx.chunk_size = chunk_size
    ctx.dt_softplus = dt_softplus
    ctx.save_for_backward(x, dt, A, B, C, D, dt_bias, initial_states)


def _backward(ctx, dy: Tensor, dfinal: Tensor | None):
    x, dt, A, B, C, D, dt_bias, initial_states = ctx.saved_tensors
    b, _, h, p = x.shape
    if dfinal is None:
        dfinal = x.new_zeros((b, h, p, B.shape[-1]), dtype=torch.float32)
    if dy is None:
        dy = torch.zeros_like(x)
    dx, ddt, dA, dB, dC, dD, dbias, dinit = ssd_bwd(
        dy, dfinal, x, dt, A, B, C, ctx.chunk_size, D, dt_bias, ctx.dt_softplus, initial_states
    )
    return (
        dx,
        ddt,
        dA,
        dB,
        dC,
        None,
        None if D is None else dD,
        None if dt_bias is None else dbias,
        None,
        None if initial_states is None else dinit,
    )


torch.library.register_autograd("mamba2_cutile::ssd_fwd", _backward, setup_context=_setup_context)
