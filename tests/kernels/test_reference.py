"""The reference SSD against the float64 recurrence, and its gradients."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels import reference

F64 = torch.float64


def inputs(b, l, h, p, g, n, seed, init=True, dtype=F64):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=F64) * scale).to(dtype)

    return dict(
        x=r(b, l, h, p),
        dt=r(b, l, h, scale=0.5) - 1.0,
        A=-torch.exp(r(h, scale=0.5)),
        B=r(b, l, g, n),
        C=r(b, l, g, n),
        D=r(h),
        dt_bias=r(h, scale=0.5),
        initial_states=r(b, h, p, n) if init else None,
    )


def chunked(t, chunk, softplus=True):
    return reference.ssd_chunked(
        t["x"], t["dt"], t["A"], t["B"], t["C"], chunk, t["D"], t["dt_bias"], softplus, t["initial_states"]
    )


def oracle(t, softplus=True):
    return reference.ssd_recurrent(
        t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["dt_bias"], softplus, t["initial_states"]
    )


# L not a multiple of the chunk, g > 1, several p, n, chunk sizes, with and without initial states.
GRID = list(
    itertools.product(
        [(1, 1), (2, 37), (1, 64), (2, 100)],  # (b, l)
        [(4, 1), (4, 2), (6, 3)],  # (h, g)
        [(4, 3), (16, 8)],  # (p, n)
        [8, 16, 64],  # chunk
        [False, True],  # initial states
    )
)


@pytest.mark.parametrize("bl,hg,pn,chunk,init", GRID)
def test_chunked_equals_recurrence(bl, hg, pn, chunk, init):
    (b, l), (h, g), (p, n) = bl, hg, pn
    t = inputs(b, l, h, p, g, n, seed=l * 7 + h + p + chunk, init=init)
    y, state = chunked(t, chunk)
    y_ref, state_ref = oracle(t)
    assert y.shape == (b, l, h, p) and state.shape == (b, h, p, n)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, state_ref, rtol=1e-10, atol=1e-10)


def test_float32_close_to_float64_oracle():
    t = inputs(2, 300, 4, 16, 2, 16, seed=3, dtype=torch.float32)
    y, state = chunked(t, 64)
    y_ref, state_ref = oracle(t)
    assert y.dtype == torch.float32 and state.dtype == torch.float32
    assert ((y.double() - y_ref).norm() / y_ref.norm()) < 1e-5
    assert ((state.double() - state_ref).norm() / state_ref.norm()) < 1e-5


def test_without_softplus_or_optional_inputs():
    t = inputs(1, 40, 2, 4, 1, 3, seed=5, init=False)
    t["dt"] = t["dt"].abs() * 0.1
    y, s = reference.ssd_chunked(t["x"], t["dt"], t["A"], t["B"], t["C"], 16)
    y_ref, s_ref = reference.ssd_recurrent(t["x"], t["dt"], t["A"], t["B"], t["C"])
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(s, s_ref)


def test_final_state_continues_the_sequence():
    """Splitting a sequence in two and carrying the final state gives the same outputs."""
    t = inputs(2, 90, 4, 8, 2, 6, seed=9, init=False)
    y_full, s_full = chunked(t, 16)
    first = {k: (v[:, :50] if k in ("x", "dt", "B", "C") else v) for k, v in t.items()}
    y1, s1 = chunked(first, 16)
    second = {k: (v[:, 50:] if k in ("x", "dt", "B", "C") else v) for k, v in t.items()}
    second["initial_states"] = s1
    y2, s2 = chunked(second, 16)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y_full)
    torch.testing.assert_close(s2, s_full)


def test_chunk_cumsum_restarts_every_chunk_and_zeroes_padding():
    dt = torch.rand(1, 20, 2, dtype=F64)
    A = torch.tensor([-1.0, -2.0], dtype=F64)
    dt_out, dA = reference.chunk_cumsum(dt, A, 8)
    assert dt_out.shape == dA.shape == (1, 2, 3, 8)
    torch.testing.assert_close(dA[0, 1, 1, 0], dt[0, 8, 1] * -2.0)  # restart at token 8
    assert (dt_out[0, :, 2, 4:] == 0).all()  # tokens 20..23 are padding


def test_gradcheck_every_input():
    t = inputs(1, 11, 2, 3, 1, 2, seed=1)
    names = ["x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states"]
    leaves = [t[k].clone().requires_grad_(True) for k in names]

    def f(x, dt, A, B, C, D, dt_bias, init):
        return reference.ssd_chunked(x, dt, A, B, C, 4, D, dt_bias, True, init)

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-5)


def test_no_nan_gradients_when_length_is_not_a_multiple_of_the_chunk():
    t = inputs(2, 70, 4, 8, 2, 8, seed=2, dtype=torch.float32)
    leaves = {k: v.clone().requires_grad_(True) for k, v in t.items() if v is not None}
    y, s = reference.ssd_chunked(
        leaves["x"],
        leaves["dt"],
        leaves["A"],
        leaves["B"],
        leaves["C"],
        64,
        leaves["D"],
        leaves["dt_bias"],
        True,
        leaves["initial_states"],
    )
    (y.square().sum() + s.sum()).backward()
    for name, leaf in leaves.items():
        assert torch.isfinite(leaf.grad).all(), name
