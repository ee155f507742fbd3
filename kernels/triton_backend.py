"""The triton backend of `kernels.ssd`: mamba_ssm 2.3.2.post1's fused chunked scan (forward and backward).

mamba_ssm's own entry point (`mamba_chunk_scan_combined`) is a `torch.autograd.Function`, which
torch.compile cannot trace into: the graph breaks around every SSD call. Here its forward and
backward are two `torch.library` custom ops (with fake implementations, so the compiler knows their
output shapes without running them) joined by `register_autograd`: a compiled model keeps one graph.
Outside torch.compile the same two bodies run as an autograd.Function (EagerTriton), without the custom
ops' dispatch, as the cutile backend's do (kernels.cutile.ssd.EagerSSD): eager comparisons of the two
backends pay the same wrapping.

Optional: importing this module fails where mamba_ssm is not installed, and `kernels.ssd` then says so.
"""

from __future__ import annotations

import contextlib

import torch
from mamba_ssm.ops.triton.ssd_combined import _mamba_chunk_scan_combined_bwd, _mamba_chunk_scan_combined_fwd
from torch import Tensor


def _on_device(x: Tensor):
    """Launch on x's GPU (mamba_ssm's Triton kernels have failed on a GPU other than the current one)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def triton_forward(
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
) -> tuple[Tensor, Tensor]:
    """y (b, l, h, p) in x's dtype and final_state (b, h, p, n) float32 from mamba_ssm's Triton kernels."""
    with _on_device(x):
        y, _, _, _, _, final_state = _mamba_chunk_scan_combined_fwd(
            x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, initial_states=initial_states, dt_softplus=dt_softplus
        )
    return y, final_state.float()


# needs_fixed_stride_order: mamba_ssm takes strided views (it copies what its kernels cannot read), so Inductor
# must not copy inputs such as dt, a view of in_proj's output, to match eager strides exactly.
ssd_fwd = torch.library.custom_op(
    "mamba2_triton::ssd_fwd", triton_forward, mutates_args=(), tags=(torch.Tag.needs_fixed_stride_order,)
)


@ssd_fwd.register_fake
def _(x, dt, A, B, C, chunk_size, D=None, dt_bias=None, dt_softplus=False, initial_states=None):
    b, _, h, p = x.shape
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(
        (b, h, p, B.shape[-1]), dtype=torch.float32
    )


def triton_gradients(
    dy: Tensor,
    dfinal_state: Tensor | None,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    y: Tensor,
    chunk_size: int,
    D: Tensor | None,
    dt_bias: Tensor | None,
    dt_softplus: bool,
    initial_states: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, ddt, dA, dB, dC, dD, ddt_bias, dinitial_states), each in its input's dtype; an absent
    optional input (D, dt_bias, initial_states) gets an empty tensor in its place."""
    with _on_device(x):
        dx, ddt, dA, dB, dC, dD, _, ddt_bias, dinit = _mamba_chunk_scan_combined_bwd(
            dy,
            x,
            dt,
            A,
            B,
            C,
            y,
            chunk_size,
            D=D,
            dt_bias=dt_bias,
            initial_states=initial_states,
            dfinal_states=dfinal_state,
            dt_softplus=dt_softplus,
        )
    return (
        dx.to(x.dtype),
        ddt.to(dt.dtype),
        dA.to(A.dtype),
        dB.to(B.dtype),
        dC.to(C.dtype),
        *(
            g.to(t.dtype) if t is not None else x.new_empty(0)
            for g, t in ((dD, D), (ddt_bias, dt_bias), (dinit, initial_states))
        ),
    )


ssd_bwd = torch.library.custom_op(
    "mamba2_triton::ssd_bwd", triton_gradients, mutates_args=(), tags=(torch.Tag.needs_fixed_stride_order,)
)


@ssd_bwd.register_fake
def _(dy, dfinal_state, x, dt, A, B, C, y, chunk_size, D, dt_bias, dt_softplus, initial_states):
    optional = (torch.empty_like(t) if t is not None else x.new_empty(0) for t in (D, dt_bias, initial_states))
    return tuple(torch.empty_like(t) for t in (x, dt, A, B, C)) + tuple(optional)


def _setup_context(ctx, inputs, output) -> None:
    x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states = inputs
    ctx.save_for_backward(x, dt, A, B, C, output[0], D, dt_bias, initial_states)
    ctx.chunk_size, ctx.dt_softplus = chunk_size, dt_softplus


def _input_gradients(gradients, ctx, dy: Tensor, dfinal_state: Tensor | None):
    """The gradient of each forward input, from `gradients` (triton_gradients, or the op made of it)."""
    x, dt, A, B, C, y, D, dt_bias, initial_states = ctx.saved_tensors
    dx, ddt, dA, dB, dC, dD, ddt_bias, dinit = gradients(
        dy, dfinal_state, x, dt, A, B, C, y, ctx.chunk_size, D, dt_bias, ctx.dt_softplus, initial_states
    )
    return (
        dx,
        ddt,
        dA,
        dB,
        dC,
        None,
        dD if D is not None else None,
        ddt_bias if dt_bias is not None else None,
        None,
        dinit if initial_states is not None else None,
    )


def _backward(ctx, dy: Tensor, dfinal_state: Tensor | None):
    """The op's backward: through the op ssd_bwd, so that a compiled backward graph holds it as one node."""
    return _input_gradients(ssd_bwd, ctx, dy, dfinal_state)


ssd_fwd.register_autograd(_backward, setup_context=_setup_context)


class EagerTriton(torch.autograd.Function):
    """triton_forward and triton_gradients as an autograd.Function, for calls outside torch.compile (see the
    module's docstring). Its forward takes ctx itself, so Function.apply does not bind arguments by signature."""

    @staticmethod
    def forward(ctx, *args):
        output = triton_forward(*args)
        _setup_context(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, dy: Tensor, dfinal_state: Tensor | None):
        return _input_gradients(triton_gradients, ctx, dy, dfinal_state)


def ssd_triton(
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
) -> tuple[Tensor, Tensor]:
    """The triton backend of `kernels.ssd`: y (b, l, h, p) in x's dtype and final_state (b, h, p, n) float32,
    differentiable. While torch.compile traces, the custom op ssd_fwd; otherwise EagerTriton."""
    args = (x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states)
    if torch.compiler.is_compiling():
        return ssd_fwd(*args)
    return EagerTriton.apply(*args)
