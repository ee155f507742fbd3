"""The triton backend's torch.library wrapping.

On the CPU, where mamba_ssm (CUDA only) is absent, its two entry points are replaced by a test double
that computes the same quantities with the reference SSD (forward, and the backward by autograd). The
custom ops, their fake implementations and their autograd registration are the shipped ones: these
tests check the wrapping (schemas, fakes, which gradient goes where, no graph break under compile).
On a GPU with mamba_ssm, the last test runs the same checks on the real library.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest
import torch

from kernels.reference import ssd_chunked


def _fwd(
    x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None, dt_softplus=False, **_
):
    y, final_state = ssd_chunked(x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, initial_states, seq_idx)
    return y.contiguous(), None, None, None, None, final_state.clone()  # fresh and dense, as mamba_ssm returns


def _bwd(
    dout,
    x,
    dt,
    A,
    B,
    C,
    out,
    chunk_size,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    dfinal_states=None,
    seq_idx=None,
    dt_softplus=False,
    **_,
):
    present = {
        k: v
        for k, v in dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, initial_states=initial_states).items()
        if v is not None
    }

    def ssd(inputs):
        return ssd_chunked(chunk_size=chunk_size, dt_softplus=dt_softplus, seq_idx=seq_idx, **inputs)

    (_, final_state), vjp = torch.func.vjp(ssd, present)  # below autograd, as a custom op runs: functorch's vjp
    dfinal = torch.zeros_like(final_state) if dfinal_states is None else dfinal_states.to(final_state.dtype)
    (grads,) = vjp((dout, dfinal))
    g = lambda name: grads.get(name)
    return g("x"), g("dt"), g("A"), g("B"), g("C"), g("D"), None, g("dt_bias"), g("initial_states")


@pytest.fixture(scope="module")
def triton_backend():
    if importlib.util.find_spec("mamba_ssm") is not None:
        pytest.skip("mamba_ssm is installed: test_real_mamba_ssm_on_gpu covers it")
    names = ["mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.ssd_combined"]
    with pytest.MonkeyPatch.context() as mp:
        for name in names:
            mp.setitem(sys.modules, name, types.ModuleType(name))
        sys.modules[names[-1]]._mamba_chunk_scan_combined_fwd = _fwd
        sys.modules[names[-1]]._mamba_chunk_scan_combined_bwd = _bwd
        module = importlib.import_module("kernels.triton_backend")
        yield module
        sys.modules.pop("kernels.triton_backend", None)  # later imports fail again, as they should here


def _inputs(with_optional: bool, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    b, l, h, p, g, n = 2, 37, 4, 8, 2, 6
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    out = {"x": r(b, l, h, p), "dt": r(b, l, h), "A": -torch.rand(h, generator=gen, dtype=dtype) - 0.5}
    out |= {"B": r(b, l, g, n), "C": r(b, l, g, n)}
    if with_optional:
        out |= {"D": r(h), "dt_bias": r(h), "initial_states": r(b, h, p, n)}
    return out


@pytest.mark.parametrize("with_optional", [True, False])
def test_forward_and_gradients_pass_through(triton_backend, with_optional):
    inputs = _inputs(with_optional)
    kwargs = dict(chunk_size=16, dt_softplus=True)
    state_weight = torch.randn(inputs["initial_states"].shape if with_optional else (2, 4, 8, 6), dtype=torch.float32)

    def run(fn):
        leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
        y, final_state = fn(
            leaves["x"],
            leaves["dt"],
            leaves["A"],
            leaves["B"],
            leaves["C"],
            D=leaves.get("D"),
            dt_bias=leaves.get("dt_bias"),
            initial_states=leaves.get("initial_states"),
            **kwargs,
        )
        # linear in the state: its gradient is exact in float32, the state's dtype here as in mamba_ssm
        ((y * y.detach().cos()).sum() + (final_state * state_weight).sum()).backward()
        return y, final_state, {k: v.grad for k, v in leaves.items()}

    y, state, grads = run(triton_backend.ssd_triton)
    assert type(y.grad_fn).__name__ == "mamba2_triton::ssdBackward"  # outside torch.compile: no custom-op dispatch
    y_ref, state_ref, grads_ref = run(ssd_chunked)
    assert y.dtype == torch.float64 and state.dtype == torch.float32  # the final state is float32, as mamba_ssm's
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(state, state_ref.float())
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], msg=name)


def test_document_boundaries_pass_through(triton_backend):
    """seq_idx reaches mamba_ssm's forward and backward: values and gradients as the reference's with seq_idx,
    and not as without it."""
    inputs = _inputs(True)
    seq_idx = torch.tensor([[0] * 10 + [1] * 20 + [2] * 7, [0] * 37], dtype=torch.int32)

    def run(fn, seq):
        leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
        y, state = fn(
            *(leaves[k] for k in ("x", "dt", "A", "B", "C")),
            16,
            leaves["D"],
            leaves["dt_bias"],
            True,
            leaves["initial_states"],
            seq,
        )
        (y.square().sum() + state.sum()).backward()
        return [y, state.float(), *(v.grad for v in leaves.values())]

    got, want = run(triton_backend.ssd_triton, seq_idx), run(ssd_chunked, seq_idx)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(got[0], run(ssd_chunked, None)[0])


def test_opcheck_schema_fake_and_autograd(triton_backend):
    """torch.library.opcheck: the schema, the fake implementation and the autograd registration agree."""
    inputs = _inputs(True, dtype=torch.float32)
    args = [inputs[k] for k in ("x", "dt", "A", "B", "C")]
    args = [t.requires_grad_() for t in args]
    optional = [inputs["D"].requires_grad_(), inputs["dt_bias"].requires_grad_(), True, inputs["initial_states"]]
    seq_idx = torch.tensor([[0] * 20 + [1] * 17, [0] * 37], dtype=torch.int32)
    torch.library.opcheck(triton_backend.ssd_fwd, (*args, 16, *optional, None))
    torch.library.opcheck(triton_backend.ssd_fwd, (*args, 16, *optional, seq_idx))
    torch.library.opcheck(triton_backend.ssd_fwd, (*args, 16, None, None, False, None, None))


def test_compiles_as_one_graph(triton_backend):
    """fullgraph=True raises on any graph break: the custom op mamba2_triton::ssd_fwd is traced, not stepped around
    (nor the eager Function, which torch.compile would trace as a Function)."""
    inputs = _inputs(True, dtype=torch.float32)
    x = inputs["x"].clone().requires_grad_()
    traced = []

    def recording(gm, example_inputs):
        op = torch.ops.mamba2_triton.ssd_fwd.default
        traced.extend(len(node.args) for node in gm.graph.nodes if node.target is op)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    def f(x):
        y, state = triton_backend.ssd_triton(
            x,
            inputs["dt"],
            inputs["A"],
            inputs["B"],
            inputs["C"],
            16,
            D=inputs["D"],
            dt_bias=inputs["dt_bias"],
            dt_softplus=True,
        )
        return y.square().sum() + state.sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=recording)
    loss = compiled(x)
    assert traced == [11]
    loss.backward()
    x_ref = inputs["x"].clone().requires_grad_()
    f(x_ref).backward()
    torch.testing.assert_close(loss, f(inputs["x"]))
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_mamba_ssm_on_gpu():
    """The shipped op on mamba_ssm's kernels: fake and real agree (opcheck), values and gradients match
    the reference within bf16 tolerance, and a compiled caller keeps one graph."""
    import kernels

    reason = kernels.unavailable_reason("triton", "cuda")
    if reason is not None:
        pytest.skip(reason)
    from kernels.triton_backend import ssd_fwd, ssd_triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    b, l, h, p, g, n = 2, 300, 4, 64, 1, 64
    r = lambda *s, dtype=torch.bfloat16: torch.randn(*s, generator=gen, device="cuda", dtype=dtype)
    inputs = {"x": r(b, l, h, p), "dt": r(b, l, h, dtype=torch.float32), "A": -torch.rand(h, device="cuda") - 0.5}
    inputs |= {"B": r(b, l, g, n), "C": r(b, l, g, n), "D": r(h, dtype=torch.float32)}
    inputs |= {"dt_bias": r(h, dtype=torch.float32), "initial_states": r(b, h, p, n, dtype=torch.float32)}
    names = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")
    args = lambda leaves: (
        *(leaves[k] for k in names[:5]),
        64,
        leaves["D"],
        leaves["dt_bias"],
        True,
        leaves["initial_states"],
    )

    torch.library.opcheck(ssd_fwd, args({k: v.clone().requires_grad_() for k, v in inputs.items()}))

    def grads(fn):
        leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
        y, state = fn(*args(leaves))
        (y.float().square().sum() + state.square().sum()).backward()
        return y, state, {k: leaves[k].grad for k in names}

    y, state, g_tr = grads(ssd_triton)
    y_ref, state_ref, g_ref = grads(ssd_chunked)
    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()
    assert rel(y, y_ref) < 2e-2 and rel(state, state_ref) < 2e-2
    for k in names:
        assert rel(g_tr[k], g_ref[k]) < 5e-2, k

    x = inputs["x"].clone().requires_grad_()
    f = lambda x: ssd_triton(x, *args(inputs)[1:])[0].float().square().sum()
    torch._dynamo.reset()
    torch.compile(f, fullgraph=True)(x).backward()
    x_eager = inputs["x"].clone().requires_grad_()
    f(x_eager).backward()
    assert rel(x.grad, x_eager.grad) < 1e-3
