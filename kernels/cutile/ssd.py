"""The cuTile SSD as a differentiable PyTorch op: the stages composed, forward and backward.

    forward   chunk_cumsum -> fwd_pass_state -> compute_out                  (as kernels.reference.ssd_chunked)
    backward  "reference": autograd through kernels.reference.ssd_chunked   (the design this project measures)
              "cutile":    kernels.reference_backward.ssd_backward composing the cuTile passes:
                           chunk_cumsum (also writing dA_cumsum·log2(e) for bwd_dx) -> the two state walks
                           (kernels.cutile.state_walks: fwd_pass_state's recomputing the chunk states and
                           bwd_pass_state's, in one launch) -> bwd_dx -> bwd_dbc -> chunk_cumsum_bwd

Only the inputs are saved for the backward; the chunk states are recomputed there. The chunked form's result
does not depend on the chunk size (up to rounding), so the cuTile backward picks its own: at most
BACKWARD_CHUNK tokens, whose chunk x chunk tiles fit a program's registers (at 128 they spill). The backend's entry,
`ssd_cutile`, runs the two bodies (`ssd_forward`, `ssd_gradients`) as `torch.library.custom_op`s with fake
implementations and an autograd registration while torch.compile traces, so `torch.compile(model, fullgraph=True)`
holds each as a single node, and as an autograd.Function (EagerSSD) otherwise. An output the loss does not use
reaches the backward as None, not as a tensor of zeros: the final state's, usually, which then costs no fill and
no read (bwd_pass_state starts from zero in registers).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernels import reference
from kernels.backends import BACKWARDS
from kernels.cutile.bwd_dbc import bwd_dbc
from kernels.cutile.bwd_dx import bwd_dx
from kernels.cutile.chunk_cumsum import chunk_cumsum, chunk_cumsum_log2
from kernels.cutile.chunk_cumsum_bwd import chunk_cumsum_bwd
from kernels.cutile.compute_out import compute_out
from kernels.cutile.fwd_pass_state import fwd_pass_state
from kernels.cutile.state_walks import after_state_walks, state_walks
from kernels.reference_backward import Passes, by_input, ssd_backward

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_CHUNKS = (16, 32, 64, 128, 256)
BACKWARD_CHUNK = 64  # the cuTile backward's chunk size at most (it holds chunk x chunk tiles per program)
MAX_DIM = 256  # head dim and state dim: one tile each


def check_inputs(tensors: dict[str, Tensor | None], chunk_size: int, backward: str) -> None:
    """Raise ValueError for inputs the kernels cannot take as they are (shapes are checked by kernels.ssd).

    Args:
        tensors: the SSD's tensor inputs by name (x, dt, A, B, C, D, dt_bias, initial_states; None where absent).
    """
    x, B, C = tensors["x"], tensors["B"], tensors["C"]
    for name, t in tensors.items():
        if t is None:
            continue
        if not t.is_cuda:
            raise ValueError(f"cutile backend: {name} is on {t.device}; move the inputs to a CUDA device")
        if t.device != x.device:
            raise ValueError(f"cutile backend: {name} is on {t.device} but x is on {x.device}")
    for name, t in (("x", x), ("B", B), ("C", C), ("dt", tensors["dt"])):
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"cutile backend: {name} has dtype {t.dtype}; supported: bfloat16, float16, float32")
        if t.stride(-1) != 1:
            raise ValueError(
                f"cutile backend: {name} has stride {t.stride(-1)} along its last dim; the kernels read it "
                f"in rows and would need a copy. Pass {name}.contiguous()."
            )
    if not (x.dtype == B.dtype == C.dtype):
        raise ValueError(
            f"cutile backend: x, B, C must share a dtype, got {x.dtype}, {B.dtype}, {C.dtype}; cast them to one"
        )
    if chunk_size not in SUPPORTED_CHUNKS:
        raise ValueError(f"cutile backend: chunk_size {chunk_size} not supported; use one of {SUPPORTED_CHUNKS}")
    if backward not in BACKWARDS:
        raise ValueError(f"cutile backend: backward must be one of {', '.join(BACKWARDS)}, got {backward!r}")
    p, n = x.shape[-1], B.shape[-1]
    if p > MAX_DIM or n > MAX_DIM:
        raise ValueError(f"cutile backend: head dim {p} and state dim {n} must be at most {MAX_DIM}")


# the backward's passes: stage 1 also writes dA_cumsum·log2(e), which ssd_backward hands to bwd_dx; the two walks
# run as kernels.cutile.state_walks.WALKS says (by default both in one launch;
# "aside" puts the recompute on a second stream, joined before bwd_dbc)
CUTILE = Passes(chunk_cumsum_log2, state_walks, bwd_dx, after_state_walks(bwd_dbc), chunk_cumsum_bwd)


def ssd_forward(
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
    backward: str,
) -> tuple[Tensor, Tensor]:
    """cuTile forward: y (b, l, h, p) in x's dtype, final_state (b, h, p, n) float32.

    `backward` ("reference" or "cutile") chooses how its gradient is computed (see `ssd_cutile`). The inputs are
    checked first (at run time also under torch.compile).
    """
    tensors = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "dt_bias": dt_bias, "initial_states": initial_states}
    check_inputs(tensors, chunk_size, backward)
    dt_out, dA_cumsum = chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus)
    chunk_states, final_state = fwd_pass_state(x, B, dt_out, dA_cumsum, initial_states)
    return compute_out(x, B, C, dt_out, dA_cumsum, chunk_states, D), final_state


# needs_fixed_stride_order: the kernels take any view with last stride 1 (dt is a view of in_proj's output), so
# Inductor must not copy inputs to match eager strides exactly.
ssd_fwd = torch.library.custom_op(
    "mamba2_cutile::ssd_fwd",
    ssd_forward,
    mutates_args=(),
    device_types="cuda",
    tags=(torch.Tag.needs_fixed_stride_order,),
)


@ssd_fwd.register_fake
def _ssd_fwd_fake(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, backward):
    b, _, h, p = x.shape
    n = B.shape[-1]
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((b, h, p, n), dtype=torch.float32)


def heads_dtype(A: Tensor) -> torch.dtype:
    """The dtype of the backward op's per-head gradients: float32, or A's when wider."""
    return torch.promote_types(A.dtype, torch.float32)


_AUTOGRAD_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.ADInplaceOrView
)


def _reference_grads(dy, dfinal, x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states):
    """The gradients by differentiating kernels.reference.ssd_chunked (recomputed) with autograd."""
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
    return [None if t is None else next(grads) for t in leaves]


def ssd_gradients(
    dy: Tensor,
    dfinal: Tensor | None,
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
    backward: str,
) -> list[Tensor]:
    """Gradients [dx, ddt, dB, dC, dheads, dinitial_states], each in its input's dtype and layout (contiguous);
    dheads (3, h), float32 (float64 with a float64 A), holds the rows dA, d dt_bias, dD (a row is zero when its
    input is None; kernels.reference_backward.by_input splits them): one tensor, because an op's outputs may not
    share memory and the cuTile passes finish all three in one sum. Without initial_states, an
    empty tensor stands in for its gradient."""
    rest = (D, dt_bias, dt_softplus, initial_states)
    dtype = heads_dtype(A)
    if backward == "cutile":
        Q = min(chunk_size, BACKWARD_CHUNK)
        dx, ddt, dB, dC, dheads, dinit = ssd_backward(dy.contiguous(), dfinal, x, dt, A, B, C, Q, *rest, CUTILE)
    else:
        if dfinal is None:
            dfinal = x.new_zeros(x.shape[:1] + x.shape[2:] + B.shape[-1:], dtype=torch.float32)
        dx, ddt, dA, dB, dC, dD, dbias, dinit = _reference_grads(dy, dfinal, x, dt, A, B, C, chunk_size, *rest)
        zero = A.new_zeros(A.shape, dtype=dtype)
        dheads = torch.stack([zero if g is None else g.to(dtype) for g in (dA, dbias, dD)])
    out = []
    for t, gt in zip((x, dt, B, C, initial_states), (dx, ddt, dB, dC, dinit)):
        if t is None:
            out.append(x.new_empty(0))
        elif gt is None:  # an input the output does not depend on
            out.append(torch.zeros_like(t, memory_format=torch.contiguous_format))
        else:
            out.append(gt.to(t.dtype).contiguous())
    return [*out[:4], dheads.to(dtype), out[4]]


ssd_bwd = torch.library.custom_op(
    "mamba2_cutile::ssd_bwd", ssd_gradients, mutates_args=(), tags=(torch.Tag.needs_fixed_stride_order,)
)


@ssd_bwd.register_fake
def _ssd_bwd_fake(dy, dfinal, x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, backward):
    dinit = x.new_empty(0) if initial_states is None else initial_states.new_empty(initial_states.shape)
    return [t.new_empty(t.shape) for t in (x, dt, B, C)] + [A.new_empty((3, *A.shape), dtype=heads_dtype(A)), dinit]


def _setup_context(ctx, inputs, output) -> None:
    x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, backward = inputs
    ctx.chunk_size, ctx.dt_softplus, ctx.backward = chunk_size, dt_softplus, backward
    ctx.save_for_backward(x, dt, A, B, C, D, dt_bias, initial_states)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (_backward and ssd_bwd take None)


def _input_gradients(gradients: Callable[..., list[Tensor]], ctx, dy: Tensor | None, dfinal: Tensor | None):
    """The gradient of each forward input, from `gradients` (ssd_gradients, or the op made of it)."""
    x, dt, A, B, C, D, dt_bias, initial_states = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    grads = gradients(
        dy, dfinal, x, dt, A, B, C, ctx.chunk_size, D, dt_bias, ctx.dt_softplus, initial_states, ctx.backward
    )
    dx, ddt, dA, dB, dC, dD, dbias, dinit = by_input(grads, D, dt_bias)
    dA, dD, dbias = (None if t is None else g.to(t.dtype) for g, t in ((dA, A), (dD, D), (dbias, dt_bias)))
    return dx, ddt, dA, dB, dC, None, dD, dbias, None, None if initial_states is None else dinit, None


def _backward(ctx, dy: Tensor | None, dfinal: Tensor | None):
    """The op's backward: through the op ssd_bwd, so that a compiled backward graph holds it as one node."""
    return _input_gradients(ssd_bwd, ctx, dy, dfinal)


torch.library.register_autograd("mamba2_cutile::ssd_fwd", _backward, setup_context=_setup_context)


class EagerSSD(torch.autograd.Function):
    """ssd_forward and ssd_gradients as an autograd.Function, for calls outside torch.compile. The computation is
    the ops', without their dispatch (the custom op's autograd wrapper and two trips through the dispatcher),
    which costs about 0.26 ms of host time per forward + backward at the seed shape on an H200's host
    (results/probes/eager_paths.py: the op 1.53 ms, the same bodies as a Function 1.26). Its forward takes ctx
    itself: with a separate setup_context, Function.apply binds the arguments through inspect.signature on every
    call."""

    @staticmethod
    def forward(ctx, *args):
        output = ssd_forward(*args)
        _setup_context(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, dy: Tensor | None, dfinal: Tensor | None):
        return _input_gradients(ssd_gradients, ctx, dy, dfinal)


def ssd_cutile(
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
    backward: str,
) -> tuple[Tensor, Tensor]:
    """The cutile backend of `kernels.ssd`: y (b, l, h, p) in x's dtype and final_state (b, h, p, n) float32,
    differentiable. While torch.compile traces, the custom op ssd_fwd (a single graph node, its backward the op
    ssd_bwd); otherwise EagerSSD, the same bodies with less host time."""
    args = (x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, backward)
    if torch.compiler.is_compiling():
        return ssd_fwd(*args)
    return EagerSSD.apply(*args)
