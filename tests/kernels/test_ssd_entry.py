"""kernels.ssd: one entry point, shape checks, backend choice, timing marks, torch.compile."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import kernels
from kernels import backends
from kernels.reference import ssd_recurrent


def make(b=2, l=30, h=4, p=8, g=2, n=6):
    torch.manual_seed(0)
    return (
        torch.randn(b, l, h, p),
        torch.randn(b, l, h),
        -torch.rand(h) - 0.1,
        torch.randn(b, l, g, n),
        torch.randn(b, l, g, n),
    )


def test_matches_oracle_and_returns_state():
    x, dt, A, B, C = make()
    D, bias = torch.randn(4), torch.randn(4)
    y, state = kernels.ssd(x, dt, A, B, C, 16, D=D, dt_bias=bias, dt_softplus=True, return_final_states=True)
    y_ref, state_ref = ssd_recurrent(x, dt, A, B, C, D, bias, True)
    assert ((y.double() - y_ref).norm() / y_ref.norm()) < 1e-5
    assert ((state.double() - state_ref).norm() / state_ref.norm()) < 1e-5
    assert isinstance(kernels.ssd(x, dt, A, B, C, 16), torch.Tensor)


@pytest.mark.parametrize(
    "position,replacement,message",
    [
        (0, torch.randn(2, 30, 4), "x must be"),
        (1, torch.randn(2, 29, 4), "dt must be"),
        (2, torch.randn(3), "A must be"),
        (4, torch.randn(2, 30, 2, 5), "C must have B's shape"),
    ],
)
def test_bad_shapes_raise_clear_errors(position, replacement, message):
    args = list(make())
    args[position] = replacement
    with pytest.raises(ValueError, match=message):
        kernels.ssd(*args, 16)


@pytest.mark.parametrize("value", [0.5, 0.0, -0.0])
def test_a_that_does_not_decay_is_refused(value):
    """A positive or zero A (-exp(A_log) with A_log at -inf) is an error naming A and what diverged."""
    x, dt, A, B, C = make()
    A = A.clone()
    A[1] = value
    with pytest.raises(ValueError, match=r"A must be negative.*diverged"):
        kernels.ssd(x, dt, A, B, C, 16)


def test_seq_idx_restarts_the_state_and_is_checked():
    x, dt, A, B, C = make()
    seq_idx = torch.tensor([[0] * 7 + [1] * 23, [0] * 16 + [1] * 14], dtype=torch.int32)  # one edge on a chunk edge
    y, state = kernels.ssd(x, dt, A, B, C, 16, seq_idx=seq_idx, dt_softplus=True, return_final_states=True)
    y_ref, state_ref = ssd_recurrent(x, dt, A, B, C, dt_softplus=True, seq_idx=seq_idx)
    torch.testing.assert_close(y, y_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, state_ref.float(), rtol=1e-4, atol=1e-4)
    y_alone = kernels.ssd(x[:1, 7:], dt[:1, 7:], A, B[:1, 7:], C[:1, 7:], 16, dt_softplus=True)
    torch.testing.assert_close(y[:1, 7:], y_alone, rtol=1e-4, atol=1e-4)  # the second document as if alone
    for bad, message in ((seq_idx.long(), "int32"), (seq_idx[:, :-1], r"\(batch, seqlen\) = \(2, 30\)")):
        with pytest.raises(ValueError, match=message):
            kernels.ssd(x, dt, A, B, C, 16, seq_idx=bad)


def test_heads_not_divisible_by_groups():
    x, dt, A, _, _ = make()
    B = C = torch.randn(2, 30, 3, 6)
    with pytest.raises(ValueError, match=r"nheads \(4\) must be divisible by ngroups \(3\)"):
        kernels.ssd(x, dt, A, B, C, 16)


def test_bad_optional_shapes_and_chunk():
    x, dt, A, B, C = make()
    with pytest.raises(ValueError, match="chunk_size"):
        kernels.ssd(x, dt, A, B, C, 0)
    with pytest.raises(ValueError, match="D must be"):
        kernels.ssd(x, dt, A, B, C, 16, D=torch.ones(3))
    with pytest.raises(ValueError, match="initial_states must be"):
        kernels.ssd(x, dt, A, B, C, 16, initial_states=torch.zeros(2, 4, 8, 5))


@pytest.mark.parametrize("name", ["cutile", "triton"])
def test_gpu_backends_on_cpu_say_why(name):
    with pytest.raises(RuntimeError, match=rf"SSD backend '{name}' cannot run here: .*CUDA GPU"):
        kernels.ssd(*make(), 16, backend=name)


def test_unknown_backend():
    with pytest.raises(RuntimeError, match="unknown SSD backend 'fast'"):
        kernels.ssd(*make(), 16, backend="fast")


def test_auto_picks_torch_on_cpu_and_says_so_once(caplog):
    backends._resolve.cache_clear()
    with caplog.at_level(logging.WARNING, logger="kernels"):
        assert kernels.resolve("auto", "cpu") == "torch"
        assert kernels.resolve("auto", "cpu") == "torch"
    said = [r.message for r in caplog.records if "auto ->" in r.message]
    assert len(said) == 1 and "pure PyTorch" in said[0]


def test_timer_records_forward_and_backward():
    x, dt, A, B, C = make()
    x.requires_grad_(True)
    kernels.ssd_timer.reset()
    kernels.ssd_timer.enabled = True
    try:
        y = kernels.ssd(x, dt, A, B, C, 16)
        y.square().sum().backward()
        fwd, bwd = kernels.ssd_timer.totals_ms()
    finally:
        kernels.ssd_timer.enabled = False
        kernels.ssd_timer.reset()
    assert fwd > 0 and bwd > 0
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_torch_compile_fullgraph_through_the_entry_point(monkeypatch):
    """One graph, the eager gradient, and no Dynamo warning of ours (a functools.cache wrapper traced inside the
    graph drew one in every compiled run). Dynamo warns once per message and process: its record starts empty."""
    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set(), raising=False)
    x, dt, A, B, C = make()
    x.requires_grad_(True)

    def f(x):
        return kernels.ssd(x, dt, A, B, C, 16, dt_softplus=True, backend="torch").square().mean()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(f, fullgraph=True)(x)
    assert not [str(w.message) for w in caught if "Dynamo" in str(w.message)]
    loss.backward()
    g = x.grad.clone()
    x.grad = None
    f(x).backward()
    torch.testing.assert_close(g, x.grad, rtol=1e-4, atol=1e-5)


def test_arguments_after_D_are_keywords_only():
    """mamba_ssm's mamba_chunk_scan_combined puts z after D: a positional dt_bias meant for it is refused here."""
    x, dt, A, B, C = make()
    with pytest.raises(TypeError, match="positional argument"):
        kernels.ssd(x, dt, A, B, C, 16, torch.randn(4), torch.randn(4))


def test_standin_backend_is_x_times_D_with_its_gradients():
    """backend "standin" (for the step benchmark): y = x·D in x's dtype and a zero final state of the SSD's shape,
    on any device; autograd gives dx = dy·D and dD = Σ dy·x, and nothing to dt, A, B or C."""
    x, dt, A, B, C = make()
    D = torch.randn(4)
    leaves = [t.requires_grad_() for t in (x, dt, A, B, C, D)]
    assert kernels.unavailable_reason("standin", "cpu") is None and kernels.resolve("standin", "cpu") == "standin"
    y, state = kernels.ssd(x, dt, A, B, C, 16, D, dt_softplus=True, return_final_states=True, backend="standin")
    torch.testing.assert_close(y, x * D[:, None])
    assert state.shape == (2, 4, 8, 6) and state.dtype == torch.float32 and not state.any()
    dy = torch.randn_like(y)
    dx, ddt, dA, dB, dC, dD = torch.autograd.grad(y, leaves, dy, allow_unused=True)
    torch.testing.assert_close(dx, dy * D[:, None])
    torch.testing.assert_close(dD, (dy * x).sum((0, 1, 3)))
    assert ddt is None and dA is None and dB is None and dC is None
    with pytest.raises(ValueError, match="backward='cutile' needs the cutile backend; the standin backend"):
        kernels.ssd(x, dt, A, B, C, 16, D, backend="standin", backward="cutile")
