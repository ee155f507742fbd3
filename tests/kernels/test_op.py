"""kernels.op: a forward body and a gradients body made one differentiable op, eager and under torch.compile.

The op here is a toy with the shape of the SSD ops' contracts: two outputs (y = k·w·x and s = Σ x along the last
dim), an optional tensor input (w), a non-tensor one (k), and the first output kept for the backward.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from kernels.op import differentiable_op, tensor_arguments

seen: list[tuple[bool, bool]] = []  # (dy is None, ds is None) per gradients call


def forward(x: Tensor, w: Tensor | None, k: int) -> tuple[Tensor, Tensor]:
    y = x * k if w is None else x * w * k
    return y, x.sum(-1)


def forward_fake(x, w, k):
    return torch.empty_like(x), x.new_empty(x.shape[:-1])


def gradients(dy: Tensor | None, ds: Tensor | None, x: Tensor, w: Tensor | None, k: int, y: Tensor) -> list[Tensor]:
    seen.append((dy is None, ds is None))
    dx = torch.zeros_like(x)
    if dy is not None:
        dx = dx + dy * k * (1 if w is None else w)
    if ds is not None:
        dx = dx + ds[..., None]
    dw = x.new_empty(0) if w is None else torch.zeros_like(w) if dy is None else (dy * y / w).sum(0)
    return [dx, dw]


def gradients_fake(dy, ds, x, w, k, y):
    return [torch.empty_like(x), x.new_empty(0) if w is None else torch.empty_like(w)]


OP = differentiable_op("kernels_test::scale", forward, forward_fake, gradients, gradients_fake, kept_outputs=(0,))
LAZY = differentiable_op(
    "kernels_test::scale_lazy", forward, forward_fake, gradients, gradients_fake, kept_outputs=(0,),
    materialize_grads=False,
)  # fmt: skip


def test_tensor_arguments_are_found_by_annotation():
    assert tensor_arguments(forward) == (0, 1)
    assert tensor_arguments(gradients) == (0, 1, 2, 3, 5)


def test_both_ops_are_registered_with_fixed_strides():
    for op in (torch.ops.kernels_test.scale_fwd.default, torch.ops.kernels_test.scale_bwd.default):
        assert torch.Tag.needs_fixed_stride_order in op.tags


@pytest.mark.parametrize("with_w", [True, False])
def test_eager_path_is_the_function_with_autograds_gradients(with_w):
    """Outside torch.compile a call is the Function: its gradients equal autograd's through the plain forward, and
    the non-tensor argument and an absent tensor argument get None."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.rand(4, requires_grad=True) + 0.5 if with_w else None
    dy, ds = torch.randn(3, 4), torch.randn(3)

    def grads(fn):
        y, s = fn(x, w, 3)
        leaves = [x] + ([w] if with_w else [])
        return y, torch.autograd.grad((y * dy).sum() + (s * ds).sum(), leaves)

    y, got = grads(OP)
    assert type(y.grad_fn).__name__ == "kernels_test::scaleBackward"
    for a, b in zip(got, grads(forward)[1], strict=True):
        torch.testing.assert_close(a, b)


def test_unused_output_reaches_gradients_as_none_only_without_materializing():
    """materialize_grads False: the gradient of an output the loss does not use arrives as None, eager and
    compiled; by default it arrives as zeros."""
    x = torch.randn(3, 4, requires_grad=True)

    def loss(op):
        return lambda x: op(x, None, 2)[0].sum()

    seen.clear()
    loss(LAZY)(x).backward()
    loss(OP)(x).backward()
    assert seen == [(False, True), (False, False)]
    seen.clear()
    torch._dynamo.reset()
    torch.compile(loss(LAZY), fullgraph=True, backend="aot_eager")(x).backward()
    assert seen[-1] == (False, True)


def test_compiled_path_traces_the_forward_op_and_agrees():
    """Under torch.compile(fullgraph=True) a call is the forward op, one graph node, and the compiled forward and
    backward (through the backward op) give the eager values and gradients."""
    torch.manual_seed(1)
    x, w = torch.randn(3, 4), torch.rand(4) + 0.5
    targets = []

    def recording(gm, example_inputs):
        targets.extend(node.target for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    def f(x, w):
        y, s = OP(x, w, 3)
        return y.square().sum() + s.sum()

    def value_and_grads(fn):
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        value = fn(*leaves)
        return value, torch.autograd.grad(value, leaves)

    eager = value_and_grads(f)
    torch._dynamo.reset()
    compiled = value_and_grads(torch.compile(f, fullgraph=True, backend=recording))
    assert torch.ops.kernels_test.scale_fwd.default in targets
    torch.testing.assert_close(compiled[0], eager[0])
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a, b)
