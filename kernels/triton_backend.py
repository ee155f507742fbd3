"""The triton backend of `kernels.ssd`: mamba_ssm 2.3.2.post1's fused chunked scan (forward and backward).

mamba_ssm's own entry point (`mamba_chunk_scan_combined`) is a `torch.autograd.Function`, which
torch.compile cannot trace into: the graph breaks around every SSD call. Here its forward and backward
bodies become an op by the helper the cutile backend's use (kernels.op): the custom ops mamba2_triton::ssd_fwd
and ssd_bwd while torch.compile traces (a compiled model keeps one graph), an autograd.Function otherwise, so
eager comparisons of the two backends pay the same wrapping.

mamba_ssm autotunes its kernels on first use; where kernels/triton_tuned.json holds this GPU's choices
(kernels.triton_choices), the first call compiles those and times nothing.

Optional: importing this module fails where mamba_ssm is not installed, and `kernels.ssd` then says so.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
from mamba_ssm.ops.triton.ssd_combined import _mamba_chunk_scan_combined_bwd, _mamba_chunk_scan_combined_fwd
from torch import Tensor

from kernels import triton_choices
from kernels.op import differentiable_op, ssd_forward_fake

log = logging.getLogger("kernels")


def autotuners() -> dict:
    """mamba_ssm's autotuned SSD kernels (triton Autotuners) by "module.kernel", unwrapping decorators stacked above
    the autotuner."""
    from mamba_ssm.ops.triton import ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_combined, ssd_state_passing
    from triton.runtime.autotuner import Autotuner

    found = {}
    for module in (ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_combined, ssd_state_passing):
        for name, obj in vars(module).items():
            while obj is not None and not isinstance(obj, Autotuner) and hasattr(obj, "fn"):
                obj = obj.fn
            if isinstance(obj, Autotuner):
                found[f"{module.__name__.rsplit('.', 1)[-1]}.{name}"] = obj
    return found


def versions() -> dict[str, str]:
    """What a recorded choice depends on besides the GPU: the kernels' source and the compiler."""
    import mamba_ssm
    import triton

    return {"mamba_ssm": mamba_ssm.__version__, "triton": triton.__version__}


@functools.cache
def use_shipped_choices(device_index: int) -> int:
    """Seed the autotuners with the shipped table's choices for this GPU, once per process and device.

    Returns:
        the number of choices seeded (0 where the table has none for this GPU and these versions).
    """
    gpu = torch.cuda.get_device_name(device_index)
    count = triton_choices.seed(autotuners(), triton_choices.read(triton_choices.SHIPPED, gpu, versions()))
    log.info("triton backend: %d shipped autotune choices for %s", count, gpu)
    return count


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
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """y (b, l, h, p) in x's dtype and final_state (b, h, p, n) float32 from mamba_ssm's Triton kernels."""
    if x.is_cuda:
        use_shipped_choices(x.device.index if x.device.index is not None else torch.cuda.current_device())
    with _on_device(x):
        y, _, _, _, _, final_state = _mamba_chunk_scan_combined_fwd(
            x,
            dt,
            A,
            B,
            C,
            chunk_size,
            D=D,
            dt_bias=dt_bias,
            initial_states=initial_states,
            seq_idx=seq_idx,
            dt_softplus=dt_softplus,
        )
    return y, final_state.float()


def triton_gradients(
    dy: Tensor,
    dfinal_state: Tensor | None,
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
    seq_idx: Tensor | None,
    y: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, ddt, dA, dB, dC, dD, ddt_bias, dinitial_states, dseq_idx), each in its input's dtype, from the forward's
    inputs and its output y; an absent optional input (D, dt_bias, initial_states) and seq_idx (no gradient) get
    an empty tensor in their place."""
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
            seq_idx=seq_idx,
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
        x.new_empty(0),
    )


def _gradients_fake(dy, dfinal_state, x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, seq_idx, y):
    optional = (torch.empty_like(t) if t is not None else x.new_empty(0) for t in (D, dt_bias, initial_states))
    return tuple(torch.empty_like(t) for t in (x, dt, A, B, C)) + tuple(optional) + (x.new_empty(0),)


# mamba_ssm takes strided views and copies what its kernels cannot read; y is kept for its backward
def _input_gradients(grads, inputs):
    """seq_idx's slot (the last) gets no gradient: the op's backward returns an empty tensor there."""
    return (*grads[:-1], None)


SSD = differentiable_op(
    "mamba2_triton::ssd",
    triton_forward,
    ssd_forward_fake,
    triton_gradients,
    _gradients_fake,
    _input_gradients,
    kept_outputs=(0,),
)
ssd_fwd, ssd_bwd = SSD.forward_op, SSD.backward_op


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
    seq_idx: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The triton backend of `kernels.ssd`: y (b, l, h, p) in x's dtype and final_state (b, h, p, n) float32,
    differentiable (seq_idx: mamba_ssm's document ids, no gradient)."""
    return SSD(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, seq_idx)
