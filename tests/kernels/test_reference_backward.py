"""The closed-form backward passes (kernels.reference_backward) against autograd through the reference SSD,
in float64, on the shapes and flags where the backward has traps: short last chunk, groups, one token,
strong decay, no optional inputs, no final-state gradient; then on the same shapes with document boundaries
(seq_idx) on chunk edges, inside chunks and around one-token documents."""

from __future__ import annotations

import pytest
import torch

from bench.inputs import random_inputs
from kernels import reference
from kernels import reference_backward as ref_bwd

F64 = torch.float64
NAMES = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")
CASES = [  # (b, l, h, g, p, n, chunk), flags
    ((2, 200, 4, 1, 8, 16, 64), {}),
    ((2, 200, 4, 2, 8, 16, 64), {}),
    ((2, 200, 4, 4, 8, 16, 64), {}),
    ((2, 200, 4, 2, 8, 16, 64), dict(softplus=False, D=False, dt_bias=False, init=False, dfinal=False)),
    ((1, 200, 4, 2, 8, 16, 64), dict(D=False, dt_bias=False, init=False)),
    ((1, 200, 4, 1, 8, 16, 64), dict(softplus=False, dfinal=False)),
    ((2, 256, 6, 2, 8, 16, 64), {}),
    ((1, 129, 4, 2, 8, 16, 128), {}),
    ((2, 50, 2, 1, 4, 8, 64), {}),
    ((2, 1, 2, 1, 4, 8, 64), {}),
    ((1, 200, 4, 2, 8, 16, 64), dict(A_scale=8.0)),
    ((1, 96, 8, 2, 16, 32, 32), {}),
]


def autograd_grads(t: dict, dy, dfinal, chunk: int, softplus: bool, seq_idx=None) -> dict:
    leaves = {k: None if v is None else v.clone().requires_grad_(True) for k, v in t.items()}
    y, final = reference.ssd_chunked(*(leaves[k] for k in NAMES[:5]), chunk, leaves["D"], leaves["dt_bias"],
                                     softplus, leaves["initial_states"], seq_idx)  # fmt: skip
    loss = (y * dy).sum() + ((final * dfinal).sum() if dfinal is not None else 0.0)
    present = [k for k in NAMES if leaves[k] is not None]
    grads = torch.autograd.grad(loss, [leaves[k] for k in present], allow_unused=True)
    return {k: torch.zeros_like(t[k]) if grad is None else grad for k, grad in zip(present, grads)}


def documents(b: int, l: int, chunk: int, seed: int) -> torch.Tensor:
    """(b, l) int32 seq_idx: boundaries at random tokens, a one-token document at token 3, row 0 also cut at every
    chunk edge; rows after the first start at document 1 (they ignore the initial state)."""
    starts = torch.rand(b, l, generator=torch.Generator().manual_seed(seed)) < 0.04
    starts[0, chunk::chunk] = True
    starts[:, 3:5] = True
    starts[:, 0] = False
    return (starts.cumsum(1) + (torch.arange(b) > 0)[:, None]).to(torch.int32)


@pytest.mark.parametrize("shape,flags", CASES)
@pytest.mark.parametrize("with_documents", [False, True])
def test_passes_equal_autograd(shape, flags, with_documents):
    b, l, h, g, p, n, chunk = shape
    seq_idx = documents(b, l, chunk, seed=l + chunk) if with_documents else None
    softplus = flags.get("softplus", True)
    t = random_inputs(b, l, h, p, g, n, F64, seed=l + h + g, D=flags.get("D", True),
                      dt_bias=flags.get("dt_bias", True), init=flags.get("init", True))  # fmt: skip
    t["A"] = t["A"] * flags.get("A_scale", 1.0)
    if not softplus:
        t["dt"] = t["dt"].abs() * 0.1
    gen = torch.Generator().manual_seed(l)
    dy = torch.randn(b, l, h, p, generator=gen, dtype=F64)
    dfinal = torch.randn(b, h, p, n, generator=gen, dtype=F64) if flags.get("dfinal", True) else None
    expected = autograd_grads(t, dy, dfinal, chunk, softplus, seq_idx)
    got = ref_bwd.ssd_backward(dy, dfinal, *(t[k] for k in NAMES[:5]), chunk, t["D"], t["dt_bias"], softplus,
                               t["initial_states"], seq_idx)  # fmt: skip
    for name, g_got in zip(NAMES, ref_bwd.by_input(got, t["D"], t["dt_bias"])):
        if t[name] is None:
            assert g_got is None, name
            continue
        torch.testing.assert_close(g_got, expected[name], rtol=1e-10, atol=1e-10, msg=name)


def test_gradients_do_not_depend_on_the_chunk_size():
    t = random_inputs(1, 150, 4, 8, 2, 16, F64, seed=4, init=True)
    dy = torch.randn(1, 150, 4, 8, dtype=F64, generator=torch.Generator().manual_seed(1))
    dfinal = torch.randn(1, 4, 8, 16, dtype=F64, generator=torch.Generator().manual_seed(2))
    args = [t[k] for k in NAMES[:5]]
    a = ref_bwd.ssd_backward(dy, dfinal, *args, 32, t["D"], t["dt_bias"], True, t["initial_states"])
    b = ref_bwd.ssd_backward(dy, dfinal, *args, 64, t["D"], t["dt_bias"], True, t["initial_states"])
    a, b = (ref_bwd.by_input(grads, t["D"], t["dt_bias"]) for grads in (a, b))
    for name, ga, gb in zip(NAMES, a, b):
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-10, msg=name)


def test_padding_tokens_do_not_leak_into_the_final_state_gradient():
    """l not a multiple of the chunk, with a final-state gradient: padded tokens must get dt = 0 after the
    softplus, or every gradient but dC changes (dt_bias makes softplus(0 + bias) > 0)."""
    t = random_inputs(1, 70, 2, 4, 1, 8, F64, seed=9, init=False)
    dy = torch.zeros(1, 70, 2, 4, dtype=F64)
    dfinal = torch.randn(1, 2, 4, 8, dtype=F64, generator=torch.Generator().manual_seed(3))
    expected = autograd_grads(t, dy, dfinal, 64, True)
    got = ref_bwd.ssd_backward(dy, dfinal, *(t[k] for k in NAMES[:5]), 64, t["D"], t["dt_bias"], True, None)
    for name, g_got in zip(
        NAMES, ref_bwd.by_input(got, t["D"], t["dt_bias"])
    ):  # dy = 0: only the final state's gradient flows, every input's but C's
        if t[name] is not None:
            torch.testing.assert_close(g_got, expected[name], rtol=1e-10, atol=1e-10, msg=name)
