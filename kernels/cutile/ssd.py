"""The cuTile SSD as a differentiable PyTorch op: the stages composed, forward and backward.

    forward   chunk_cumsum -> fwd_pass_state -> compute_out                  (as kernels.reference.ssd_chunked)
    backward  "reference": autograd through kernels.reference.ssd_chunked   (the design this project measures)
              "cutile":    `ssd_backward`, the cuTile passes composed as kernels.reference_backward.ssd_backward
                           composes the reference ones: chunk_cumsum (also writing dA_cumsum·log2(e) for bwd_dx)
                           -> the two state walks (kernels.cutile.state_walks: fwd_pass_state's recomputing the
                           chunk states and bwd_pass_state's, by default in one launch) -> bwd_dx -> bwd_dbc
                           -> chunk_cumsum_bwd

Only the inputs are saved for the backward; the chunk states are recomputed there. The chunked form's result
does not depend on the chunk size (up to rounding), so the cuTile backward picks its own: at most
BACKWARD_CHUNK tokens, whose chunk x chunk tiles fit a program's registers (at 128 they spill). The backend's entry,
`ssd_cutile`, is the op kernels.op builds of the two bodies (`ssd_forward`, `ssd_gradients`): the custom ops
mamba2_cutile::ssd_fwd and ssd_bwd while torch.compile traces, an autograd.Function otherwise. An output the loss
does not use reaches the backward as None, not as a tensor of zeros: the final state's, usually, which then costs
no fill and no read (bwd_pass_state starts from zero in registers).

Document boundaries: seq_idx (b, l) int32 (kernels.reference's semantics) goes to every stage that masks by it,
forward and backward (all but chunk_cumsum, whose cumulative sum is not reset, and chunk_cumsum_bwd, which sums the
masked decay-gradient terms bwd_dx and bwd_dbc wrote); the masks hold at any chunk size, so also at the backward's.
seq_idx None launches the kernels without masks, as before. It has no gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import reference
from kernels.cutile.bwd_dbc import bwd_dbc
from kernels.cutile.bwd_dx import bwd_dx
from kernels.cutile.chunk_cumsum import chunk_cumsum, chunk_cumsum_log2
from kernels.cutile.chunk_cumsum_bwd import chunk_cumsum_bwd
from kernels.cutile.compute_out import compute_out
from kernels.cutile.fwd_pass_state import fwd_pass_state
from kernels.cutile.launch import BACKWARD_CHUNK
from kernels.cutile.state_walks import DEFAULT_WALKS, state_walks, wait_for_walks
from kernels.op import differentiable_op, ssd_forward_fake
from kernels.reference_backward import by_input

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_CHUNKS = (16, 32, 64, 128, 256)
MAX_DIM = 256  # head dim and state dim: one tile each


def check_inputs(tensors: dict[str, Tensor | None], chunk_size: int) -> None:
    """Raise ValueError for inputs the kernels cannot take as they are (shapes are checked by kernels.ssd).

    Args:
        tensors: the SSD's tensor inputs by name (x, dt, A, B, C, D, dt_bias, initial_states, and optionally seq_idx;
            None where absent). seq_idx must be int32, (b, l) and contiguous; that its rows do not decrease is not
            checked (the check would make the host wait for the device).
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
    p, n = x.shape[-1], B.shape[-1]
    if p > MAX_DIM or n > MAX_DIM:
        raise ValueError(f"cutile backend: head dim {p} and state dim {n} must be at most {MAX_DIM}")
    seq_idx = tensors.get("seq_idx")
    if seq_idx is not None:
        check_seq_idx(seq_idx, tuple(x.shape[:2]))


def check_seq_idx(seq_idx: Tensor, batch_seqlen: tuple[int, int]) -> None:
    """Raise ValueError unless seq_idx is what the kernels read: int32, (b, l) = batch_seqlen, contiguous."""
    if seq_idx.dtype != torch.int32:
        raise ValueError(f"cutile backend: seq_idx has dtype {seq_idx.dtype}; the kernels read int32: pass it .int()")
    if tuple(seq_idx.shape) != batch_seqlen:
        raise ValueError(
            f"cutile backend: seq_idx must be (batch, seqlen) = {batch_seqlen}, got {tuple(seq_idx.shape)}"
        )
    if not seq_idx.is_contiguous():
        raise ValueError("cutile backend: seq_idx is not contiguous; pass seq_idx.contiguous()")


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
    seq_idx: Tensor | None,
    backward: str,
) -> tuple[Tensor, Tensor]:
    """cuTile forward: y (b, l, h, p) in x's dtype, final_state (b, h, p, n) float32 (the row's last document's).

    seq_idx: (b, l) int32 document ids, non-decreasing along each row, or None. `backward` ("reference" or "cutile",
    checked by kernels.ssd) chooses how its gradient is computed (see `ssd_gradients`). The inputs are checked first
    (at run time also under torch.compile).
    """
    tensors = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "dt_bias": dt_bias, "initial_states": initial_states}
    check_inputs(tensors | {"seq_idx": seq_idx}, chunk_size)
    dt_out, dA_cumsum = chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus)
    chunk_states, final_state = fwd_pass_state(x, B, dt_out, dA_cumsum, initial_states, seq_idx)
    return compute_out(x, B, C, dt_out, dA_cumsum, chunk_states, D, seq_idx), final_state


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
    walks: str = DEFAULT_WALKS,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The cuTile backward: kernels.reference_backward.ssd_backward's contract, on the cuTile passes.

    Args:
        chunk_size: the forward's; the passes run at min(chunk_size, BACKWARD_CHUNK).
        seq_idx: (b, l) int32 document ids, contiguous, or None.
        walks: how the two state walks run (kernels.cutile.state_walks.WALK_MODES).
    Returns:
        dx, ddt, dB, dC in their inputs' dtypes; dheads (3, h) float32 holds dA, d dt_bias, dD (zero rows for absent
        inputs); dinitial_states is None when initial_states is.
    """
    Q = min(chunk_size, BACKWARD_CHUNK)
    dy = dy.contiguous()
    dt_out, dA_cumsum, dA_log2 = chunk_cumsum_log2(dt, A, Q, dt_bias, dt_softplus)
    walked = state_walks(x, B, dt_out, dA_cumsum, initial_states, dy, C, dfinal_state, seq_idx, walks)
    chunk_states, _, dstates, dinit = walked
    dx, ddt_dir, da_intra, dD_parts = bwd_dx(x, dy, B, C, dt_out, dA_cumsum, dstates, D, seq_idx, dA_log2)
    wait_for_walks(x.device, walks)  # bwd_dbc reads the recomputed chunk states
    dB, dC, da_inter = bwd_dbc(x, dy, B, C, dt_out, dA_cumsum, chunk_states, dstates, seq_idx)
    ddt, dheads = chunk_cumsum_bwd(ddt_dir, da_intra, da_inter, dt_out, dt, A, dt_softplus, dt_bias, dD_parts)
    return dx, ddt, dB, dC, dheads, None if initial_states is None else dinit


def heads_dtype(A: Tensor) -> torch.dtype:
    """The dtype of the backward op's per-head gradients: float32, or A's when wider."""
    return torch.promote_types(A.dtype, torch.float32)


_AUTOGRAD_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.ADInplaceOrView
)


def _reference_grads(dy, dfinal, x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, seq_idx):
    """The gradients by differentiating kernels.reference.ssd_chunked (recomputed) with autograd; seq_idx, a
    constant of the differentiation, has none."""
    inputs = [x, dt, A, B, C, D, dt_bias, initial_states]
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in inputs]
    # A custom op's body runs below the autograd dispatch keys; let autograd record the recomputation.
    excluded = torch._C._dispatch_tls_local_exclude_set() - _AUTOGRAD_KEYS
    autograd_on = torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)
    with autograd_on, torch.enable_grad(), torch.autocast(x.device.type, enabled=False):
        lx, ldt, lA, lB, lC, lD, lbias, linit = leaves
        y, final = reference.ssd_chunked(lx, ldt, lA, lB, lC, chunk_size, lD, lbias, dt_softplus, linit, seq_idx)
        present = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad((y, final), present, (dy.to(y.dtype), dfinal), allow_unused=True))
    return [None if t is None else next(grads) for t in leaves]


def ssd_gradients(
    dy: Tensor | None,
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
    seq_idx: Tensor | None,
    backward: str,
) -> list[Tensor]:
    """Gradients [dx, ddt, dB, dC, dheads, dinitial_states], each in its input's dtype and layout (contiguous);
    dheads (3, h), float32 (float64 with a float64 A), holds the rows dA, d dt_bias, dD (a row is zero when its
    input is None; kernels.reference_backward.by_input splits them): one tensor, because an op's outputs may not
    share memory and the cuTile passes finish all three in one sum. Without initial_states, an empty tensor stands
    in for its gradient. dy or dfinal None: that output's gradient is zero (the loss does not use it). seq_idx (the
    forward's document ids, or None) has no gradient: `_input_gradients` gives None for it."""
    if dy is None:
        dy = torch.zeros_like(x)
    rest = (D, dt_bias, dt_softplus, initial_states, seq_idx)
    dtype = heads_dtype(A)
    if backward == "cutile":
        dx, ddt, dB, dC, dheads, dinit = ssd_backward(dy, dfinal, x, dt, A, B, C, chunk_size, *rest)
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


def _ssd_gradients_fake(
    dy, dfinal, x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, seq_idx, backward
):
    dinit = x.new_empty(0) if initial_states is None else initial_states.new_empty(initial_states.shape)
    return [t.new_empty(t.shape) for t in (x, dt, B, C)] + [A.new_empty((3, *A.shape), dtype=heads_dtype(A)), dinit]


def _input_gradients(grads: list[Tensor], inputs: list) -> tuple[Tensor | None, ...]:
    """ssd_gradients' six -> the gradients of x, dt, A, B, C, D, dt_bias, initial_states (per-head ones in their
    inputs' dtypes) and None for seq_idx."""
    A, D, dt_bias = inputs[2], inputs[6], inputs[7]
    dx, ddt, dA, dB, dC, dD, dbias, dinit = by_input(grads, D, dt_bias)
    dA, dD, dbias = (None if t is None else g.to(t.dtype) for g, t in ((dA, A), (dD, D), (dbias, dt_bias)))
    return dx, ddt, dA, dB, dC, dD, dbias, dinit, None


SSD = differentiable_op(
    "mamba2_cutile::ssd",
    ssd_forward,
    ssd_forward_fake,
    ssd_gradients,
    _ssd_gradients_fake,
    _input_gradients,
    materialize_grads=False,
    device_types="cuda",
)
ssd_fwd, ssd_bwd = SSD.forward_op, SSD.backward_op


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
    seq_idx: Tensor | None,
    backward: str,
) -> tuple[Tensor, Tensor]:
    """The cutile backend of `kernels.ssd`: y (b, l, h, p) in x's dtype and final_state (b, h, p, n) float32,
    differentiable, its gradient by `backward` ("reference" or "cutile"); seq_idx (b, l) int32 document ids or
    None."""
    return SSD(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, seq_idx, backward)
