"""A differentiable PyTorch op from a forward body and a gradients body: one helper for every SSD backend.

    op = differentiable_op("mamba2_cutile::ssd", forward, forward_fake, gradients, gradients_fake, input_gradients)
    y, final_state = op(x, dt, A, B, C, chunk_size, ...)       # forward's arguments, positionally

The two bodies become the `torch.library` custom ops `<name>_fwd` and `<name>_bwd`, each with a fake implementation
(its outputs' shapes and dtypes without running it), joined by `register_autograd`. While torch.compile traces, a
call is the forward op: one graph node whose backward is the backward op, so `torch.compile(model, fullgraph=True)`
keeps one graph. Otherwise a call runs the same bodies as an `autograd.Function` (`DifferentiableOp.function`),
without the ops' dispatch (the custom op's autograd wrapper and two trips through the dispatcher), which would add
host time to every eager call. The Function's forward takes ctx itself: with a separate setup_context,
Function.apply binds the arguments through inspect.signature on every call.

Contracts of the bodies:
    forward(*inputs) -> a tuple of tensors; every argument type-annotated (torch.library infers the schema), the
        tensor arguments annotated Tensor or Tensor | None.
    gradients(*grad_outputs, *inputs, *kept) -> a list or tuple of tensors; `kept` are the forward's outputs at
        `kept_outputs`. With materialize_grads False, the gradient of an output the loss does not use arrives as
        None (no tensor of zeros is filled or read).
    input_gradients(grads, inputs) -> one gradient per tensor argument of forward, in order (default: `grads`
        itself); the op returns None for the other arguments and for tensor arguments given as None.
Both ops are tagged needs_fixed_stride_order: the bodies take the strided views they accept (dt is a view of
in_proj's output), and Inductor must not copy inputs to match eager strides.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Gradients = Callable[[Sequence[Tensor], list], Sequence[Tensor | None]]


@dataclass(frozen=True)
class DifferentiableOp:
    """The forward and backward custom ops and the eager Function over the same bodies; calling it runs the op."""

    forward_op: Any  # torch.library.CustomOpDef
    backward_op: Any
    function: type[torch.autograd.Function]

    def __call__(self, *inputs: Any) -> tuple[Tensor, ...]:
        if torch.compiler.is_compiling():
            return self.forward_op(*inputs)
        return self.function.apply(*inputs)


def ssd_forward_fake(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *rest: Any) -> tuple[Tensor, Tensor]:
    """The fake of every SSD backend's forward op: y like x (contiguous) and the final state (b, h, p, n) float32."""
    b, _, h, p = x.shape
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(
        (b, h, p, B.shape[-1]), dtype=torch.float32
    )


def tensor_arguments(fn: Callable) -> tuple[int, ...]:
    """Positions of `fn`'s arguments annotated Tensor or Tensor | None."""
    hints = typing.get_type_hints(fn)
    names = inspect.signature(fn).parameters
    return tuple(i for i, name in enumerate(names) if Tensor in (hints[name], *typing.get_args(hints[name])))


def differentiable_op(
    name: str,
    forward: Callable[..., tuple[Tensor, ...]],
    forward_fake: Callable[..., tuple[Tensor, ...]],
    gradients: Callable[..., Sequence[Tensor]],
    gradients_fake: Callable[..., Sequence[Tensor]],
    input_gradients: Gradients | None = None,
    *,
    kept_outputs: tuple[int, ...] = (),
    materialize_grads: bool = True,
    device_types: str | None = None,
) -> DifferentiableOp:
    """The op of `forward` and `gradients` (see the module's docstring for their contracts).

    Args:
        name: "namespace::opname"; the custom ops are registered as <name>_fwd and <name>_bwd, once per process.
        kept_outputs: positions of forward's outputs saved for the backward, passed to gradients after the inputs.
        materialize_grads: False passes an unused output's gradient to gradients as None.
        device_types: the forward op's device types (None: every device).
    """
    tags = (torch.Tag.needs_fixed_stride_order,)
    forward_op = torch.library.custom_op(f"{name}_fwd", forward, mutates_args=(), device_types=device_types, tags=tags)
    forward_op.register_fake(forward_fake)
    backward_op = torch.library.custom_op(f"{name}_bwd", gradients, mutates_args=(), tags=tags)
    backward_op.register_fake(gradients_fake)
    slots = tensor_arguments(forward)
    constant = tuple(i not in slots for i in range(len(inspect.signature(forward).parameters)))
    per_input = input_gradients or (lambda grads, inputs: grads)

    def setup_context(ctx, inputs: tuple, output: tuple) -> None:
        ctx.save_for_backward(*(inputs[i] for i in slots), *(output[i] for i in kept_outputs))
        ctx.constants = tuple(a if c else None for a, c in zip(inputs, constant))
        ctx.set_materialize_grads(materialize_grads)

    def backward_through(body: Callable[..., Sequence[Tensor]]) -> Callable:
        def backward(ctx, *grad_outputs: Tensor | None) -> tuple[Tensor | None, ...]:
            saved = ctx.saved_tensors
            inputs = list(ctx.constants)
            for i, t in zip(slots, saved):
                inputs[i] = t
            grads = per_input(body(*grad_outputs, *inputs, *saved[len(slots) :]), inputs)
            out: list[Tensor | None] = [None] * len(inputs)
            for i, g in zip(slots, grads, strict=True):
                out[i] = None if inputs[i] is None else g
            return tuple(out)

        return backward

    forward_op.register_autograd(backward_through(backward_op), setup_context=setup_context)

    def eager_forward(ctx, *inputs: Any) -> tuple[Tensor, ...]:
        output = forward(*inputs)
        setup_context(ctx, inputs, output)
        return output

    methods = {"forward": staticmethod(eager_forward), "backward": staticmethod(backward_through(gradients))}
    return DifferentiableOp(forward_op, backward_op, type(name, (torch.autograd.Function,), methods))
