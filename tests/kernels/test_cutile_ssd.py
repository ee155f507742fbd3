"""The cutile SSD op on a CPU: its checks, its backward's composition and its eager and compiled paths (kernels replaced by the reference stages)."""

from __future__ import annotations

import inspect

import pytest
import torch

from bench import aot
from kernels.cutile import ssd as cutile_ssd
from kernels.cutile.launch import BACKWARD_CHUNK


def test_cpu_tensors_are_refused_by_the_kernels_wrapper():
    x = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="is on cpu; move the inputs to a CUDA device"):
        B, C = torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4)
        inputs = {"x": x, "dt": torch.rand(1, 8, 2), "A": -torch.ones(2), "B": B, "C": C}
        cutile_ssd.check_inputs(inputs | {"D": None, "dt_bias": None, "initial_states": None}, 64)


def test_seq_idx_is_checked_for_what_the_kernels_read():
    """seq_idx must be int32, (batch, seqlen) and contiguous: anything else is refused in one line naming the fix."""
    ok = torch.zeros(2, 8, dtype=torch.int32)
    cutile_ssd.check_seq_idx(ok, (2, 8))
    with pytest.raises(ValueError, match=r"seq_idx has dtype torch.int64; the kernels read int32: pass it .int\(\)"):
        cutile_ssd.check_seq_idx(ok.long(), (2, 8))
    with pytest.raises(ValueError, match=r"seq_idx must be \(batch, seqlen\) = \(2, 8\), got \(2, 7\)"):
        cutile_ssd.check_seq_idx(ok[:, :7], (2, 8))
    with pytest.raises(ValueError, match=r"seq_idx must be \(batch, seqlen\) = \(2, 8\), got \(16,\)"):
        cutile_ssd.check_seq_idx(ok.view(16), (2, 8))
    with pytest.raises(ValueError, match=r"seq_idx is not contiguous; pass seq_idx.contiguous\(\)"):
        cutile_ssd.check_seq_idx(torch.zeros(8, 2, dtype=torch.int32).t(), (2, 8))


def documents(b: int, l: int, chunk: int, seed: int) -> torch.Tensor:
    """seq_idx (b, l) int32 with boundaries inside chunks, on a chunk edge and around one-token documents; the first
    row starts at document 1 (its initial state then reaches nothing), the others at 0."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.zeros(b, l, dtype=torch.int32)
    for row in range(b):
        cuts = torch.randperm(l - 1, generator=gen)[: max(1, l // 9)] + 1
        starts[row, cuts] = 1
        starts[row, [chunk, chunk + 1, chunk + 2][: max(0, min(3, l - chunk))]] = 1  # a chunk edge, 1-token documents
    return (torch.cumsum(starts, 1) + (torch.arange(b)[:, None] == 0)).to(torch.int32)


def test_bad_backward_is_refused():
    """An unknown backward name, and the cutile backward asked of another backend, or of "auto" where it resolves
    to another: one clear line each, from kernels.ssd."""
    import kernels

    x = torch.randn(1, 8, 2, 4)
    args = (torch.rand(1, 8, 2), -torch.ones(2), torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4))
    with pytest.raises(ValueError, match=r"backward must be one of reference, cutile, got 'bogus'"):
        kernels.ssd(x, *args, 16, backend="torch", backward="bogus")
    with pytest.raises(ValueError, match="backward='cutile' needs the cutile backend; the torch backend, which has"):
        kernels.ssd(x, *args, 16, backend="torch", backward="cutile")
    with pytest.raises(ValueError, match="backward='cutile' needs the cutile backend; backend 'auto' runs torch here"):
        kernels.ssd(x, *args, 16, backend="auto", backward="cutile")


def test_backward_op_equals_the_closed_form_gradients():
    """The op's reference backward (autograd through ssd_chunked) against an independent oracle, the closed-form
    passes of kernels.reference_backward, in float64; then with bfloat16 inputs, x a non-contiguous view: each
    gradient in its input's dtype, contiguous, within bfloat16 rounding of the float64 gradients of those inputs."""
    from kernels.reference_backward import by_input, ssd_backward

    torch.manual_seed(0)
    b, l, h, p, g, n = 2, 37, 4, 8, 2, 6
    shapes = [(b, l, h, p), (b, l, h), (h,), (b, l, g, n), (b, l, g, n), (h,), (h,), (b, h, p, n)]
    inputs = [torch.randn(s, dtype=torch.float64) for s in shapes]
    inputs[2] = -inputs[2].abs()  # A < 0
    dy, dfinal = torch.randn(b, l, h, p, dtype=torch.float64), torch.randn(b, h, p, n, dtype=torch.float64)
    x, dt, A, B, C, D, bias, init = inputs

    def op(dy, dfinal, x, B, C, seq_idx=None):  # the op's reference backward, in the inputs' order (as closed_form's)
        grads = cutile_ssd.ssd_bwd(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, seq_idx, "reference")
        return by_input(grads, D, bias)

    def closed_form(dy, dfinal, x, B, C, seq_idx=None):
        return by_input(ssd_backward(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, seq_idx), D, bias)

    for seq_idx in (None, documents(b, l, 16, seed=0)):  # with document boundaries, the closed form's masked passes
        want = closed_form(dy, dfinal, x, B, C, seq_idx)
        for got, w in zip(op(dy, dfinal, x, B, C, seq_idx), want, strict=True):
            torch.testing.assert_close(got, w, rtol=1e-9, atol=1e-9)
            assert got.is_contiguous()
    half = [t.to(torch.bfloat16) for t in (x, B, C)]
    x16 = torch.zeros(b, l, h + 1, p, dtype=torch.bfloat16)[:, :, :h].copy_(half[0])  # a view, last stride 1
    assert not x16.is_contiguous()
    grads = op(dy.float(), dfinal.float(), x16, half[1], half[2])
    want = closed_form(dy.float().double(), dfinal, x16.double(), half[1].double(), half[2].double())
    for got, w, given in zip(grads, want, (x16, dt, A, *half[1:], D, bias, init), strict=True):
        assert got.dtype == given.dtype and got.is_contiguous()
        torch.testing.assert_close(got.double(), w, rtol=2e-2, atol=2e-2 * float(w.abs().max()))
    absent = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, 16, None, None, True, None, None, "reference")
    assert absent[5].numel() == 0 and absent[4].shape == (3, h) and not absent[4][1:].any()


def test_cutile_passes_keep_the_reference_passes_contracts():
    """Each stage kernels.cutile.ssd.ssd_backward composes takes the arguments of the reference stage
    kernels.reference_backward.ssd_backward composes in its place (and each forward stage, the reference forward's),
    by name, order and default (the GPU tests compare their results; seq_idx among them where the reference takes
    it), and is a kernel CI compiles. A stage may take more after them, each with a default (bwd_dx: dA_log2, which
    the cuTile chunk_cumsum pass returns third; state_walks: walks)."""
    from kernels import reference
    from kernels import reference_backward as ref_bwd

    compiled = {label.split("[")[0] for label, _, _ in aot.every_signature()}
    pairs = {
        "fwd_pass_state": (cutile_ssd.fwd_pass_state, reference.fwd_pass_state),
        "compute_out": (cutile_ssd.compute_out, reference.compute_out),
        "chunk_cumsum": (cutile_ssd.chunk_cumsum_log2, reference.chunk_cumsum),
        "state_walks": (cutile_ssd.state_walks, ref_bwd.state_walks),
        "bwd_dx": (cutile_ssd.bwd_dx, ref_bwd.bwd_dx),
        "bwd_dbc": (cutile_ssd.bwd_dbc, ref_bwd.bwd_dbc),
        "chunk_cumsum_bwd": (cutile_ssd.chunk_cumsum_bwd, ref_bwd.chunk_cumsum_bwd),
    }
    for stage, (ours, ref) in pairs.items():
        params = [(p.name, p.default) for p in inspect.signature(ours).parameters.values()]
        want = [(p.name, p.default) for p in inspect.signature(ref).parameters.values()]
        assert params[: len(want)] == want, stage
        assert all(default is not inspect.Parameter.empty for _, default in params[len(want) :]), stage
        assert ours.__module__ == f"kernels.cutile.{stage}" and stage in compiled, stage
    assert [p for p in inspect.signature(cutile_ssd.bwd_dx).parameters][-1] == "dA_log2"
    assert [p for p in inspect.signature(cutile_ssd.state_walks).parameters][-1] == "walks"


@pytest.fixture
def reference_stages(monkeypatch):
    """kernels.cutile.ssd with every cuTile stage and pass replaced by its reference (same contracts; the cuTile
    chunk_cumsum pass's third output, dA_log2, is None here), so its host code runs on CPU tensors."""
    from kernels import reference
    from kernels import reference_backward as ref_bwd

    for name in ("chunk_cumsum", "fwd_pass_state", "compute_out"):
        monkeypatch.setattr(cutile_ssd, name, getattr(reference, name))
    monkeypatch.setattr(cutile_ssd, "chunk_cumsum_log2", lambda *args: (*reference.chunk_cumsum(*args), None))
    monkeypatch.setattr(cutile_ssd, "state_walks", lambda *args: ref_bwd.state_walks(*args[:9]))  # not walks
    monkeypatch.setattr(cutile_ssd, "bwd_dx", lambda *args: ref_bwd.bwd_dx(*args[:9]))  # not dA_log2
    for name in ("bwd_dbc", "chunk_cumsum_bwd"):
        monkeypatch.setattr(cutile_ssd, name, getattr(ref_bwd, name))
    monkeypatch.setattr(cutile_ssd, "check_inputs", lambda tensors, chunk_size: None)


def test_backward_hands_stage_1s_third_output_to_bwd_dx(reference_stages, monkeypatch):
    """ssd_backward passes what the cuTile chunk_cumsum pass returns after dt_out and dA_cumsum (dA_cumsum·log2(e),
    from the same launch) to bwd_dx, last."""
    from kernels import reference
    from kernels import reference_backward as ref_bwd

    handed = []

    def chunk_cumsum_log2(dt, A, chunk_size, *rest):
        dt_out, dA_cumsum = reference.chunk_cumsum(dt, A, chunk_size, *rest)
        return dt_out, dA_cumsum, dA_cumsum * 2.0

    def bwd_dx(x, dy, B, C, dt_out, dA_cumsum, dstates, D=None, seq_idx=None, dA_log2=None):
        handed.append((dA_cumsum, dA_log2))
        return ref_bwd.bwd_dx(x, dy, B, C, dt_out, dA_cumsum, dstates, D, seq_idx)

    monkeypatch.setattr(cutile_ssd, "chunk_cumsum_log2", chunk_cumsum_log2)
    monkeypatch.setattr(cutile_ssd, "bwd_dx", bwd_dx)
    torch.manual_seed(3)
    b, l, h, p, g, n = 1, 40, 2, 4, 1, 4
    x, B, C = torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n)
    dt, A, dy = torch.randn(b, l, h), -torch.rand(h) - 0.1, torch.randn(b, l, h, p)
    got = cutile_ssd.ssd_backward(dy, None, x, dt, A, B, C, 16)
    ((dA_cumsum, third),) = handed
    torch.testing.assert_close(third, dA_cumsum * 2.0)
    for a, w in zip(got, ref_bwd.ssd_backward(dy, None, x, dt, A, B, C, 16), strict=True):
        assert (a is None and w is None) or torch.equal(a, w)


@pytest.mark.parametrize("with_seq_idx", [False, True], ids=["one document", "seq_idx"])
@pytest.mark.parametrize("backward", ["reference", "cutile"])
def test_eager_path_is_a_function_with_autograds_gradients(reference_stages, backward, with_seq_idx):
    """Outside torch.compile the cutile backend is the autograd.Function kernels.op builds over the ops' bodies: its
    outputs and the gradient of every input equal autograd's through kernels.reference.ssd_chunked, with the final
    state in the loss and without it (its gradient then reaches the backward as None). With document boundaries,
    seq_idx reaches every stage and pass (the results differ from one document's) and gets no gradient."""
    from kernels import reference

    torch.manual_seed(2)
    b, l, h, p, g, n = 2, 37, 4, 8, 2, 6
    x, B, C, dt = torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n), torch.randn(b, l, h)
    A, D, bias, init = -torch.rand(h) - 0.1, torch.randn(h), torch.randn(h), torch.randn(b, h, p, n)
    inputs = [t.requires_grad_() for t in (x, dt, A, B, C, D, bias, init)]
    dy, dfinal = torch.randn(b, l, h, p), torch.randn(b, h, p, n)
    seq_idx = documents(b, l, 16, seed=1) if with_seq_idx else None

    def outputs_and_grads(fn, use_final, seq_idx=seq_idx):
        x, dt, A, B, C, D, bias, init = inputs
        y, final = fn(
            x, dt, A, B, C, 16, D, bias, True, init, seq_idx, *([backward] if fn is cutile_ssd.ssd_cutile else [])
        )
        loss = (y * dy).sum() + ((final * dfinal).sum() if use_final else 0)
        return y, final, torch.autograd.grad(loss, inputs)

    for use_final in (True, False):
        y, final, grads = outputs_and_grads(cutile_ssd.ssd_cutile, use_final)
        assert type(y.grad_fn).__name__ == "mamba2_cutile::ssdBackward"
        want_y, want_final, want_grads = outputs_and_grads(reference.ssd_chunked, use_final)
        if with_seq_idx:  # the boundaries change the results: none of them is lost on the way
            one_document = outputs_and_grads(reference.ssd_chunked, use_final, None)
            assert not torch.allclose(y, one_document[0], atol=1e-3)
            assert not torch.allclose(final, one_document[1], atol=1e-3)
        torch.testing.assert_close(y, want_y)
        torch.testing.assert_close(final, want_final)
        for name, got, want in zip(("x", "dt", "A", "B", "C", "D", "dt_bias", "init"), grads, want_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"d{name}: {m}")


def test_unused_outputs_reach_the_backward_as_none(reference_stages, monkeypatch):
    """The op does not materialize gradients: a final state the loss does not use reaches the cuTile backward as
    None (no fill of zeros, and bwd_pass_state starts from zero without a load); one it uses arrives as given."""
    received = []
    composed = cutile_ssd.ssd_backward

    def ssd_backward(dy, dfinal, *rest):
        received.append(dfinal)
        return composed(dy, dfinal, *rest)

    monkeypatch.setattr(cutile_ssd, "ssd_backward", ssd_backward)
    torch.manual_seed(4)
    b, l, h, p, g, n = 1, 20, 2, 4, 1, 4
    x = torch.randn(b, l, h, p, requires_grad=True)
    args = (torch.randn(b, l, h), -torch.rand(h) - 0.1, torch.randn(b, l, g, n), torch.randn(b, l, g, n), 16)
    y, final = cutile_ssd.ssd_cutile(x, *args, None, None, True, None, None, "cutile")
    y.sum().backward()
    dfinal = torch.randn(b, h, p, n)
    y, final = cutile_ssd.ssd_cutile(x, *args, None, None, True, None, None, "cutile")
    (final * dfinal).sum().backward()
    assert received[0] is None and torch.equal(received[1], dfinal)


@pytest.mark.parametrize("backward", ["reference", "cutile"])
def test_compiled_and_eager_paths_agree(reference_stages, backward):
    """torch.compile(fullgraph=True) traces ssd_cutile as the custom op mamba2_cutile::ssd_fwd (no graph break, not
    the Function), and the compiled forward and backward give the eager path's outputs and gradients (here on the
    CPU, through the same bodies with the reference stages; the op's CPU kernel is its body, which refuses CPU
    tensors unless its checks are replaced), with document boundaries (seq_idx, an int tensor argument of the op)."""
    cutile_ssd.ssd_fwd.register_kernel("cpu")(cutile_ssd.ssd_forward)
    torch.manual_seed(3)
    b, l, h, p, g, n = 1, 40, 2, 8, 1, 4
    x, B, C, dt = torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n), torch.randn(b, l, h)
    A, D, bias = -torch.rand(h) - 0.1, torch.randn(h), torch.randn(h)
    seq_idx = documents(b, l, 16, seed=3)

    def loss(x, dt, A, B, C, D, bias):
        y, final = cutile_ssd.ssd_cutile(x, dt, A, B, C, 16, D, bias, True, None, seq_idx, backward)
        return y.square().sum() + final.sum()

    def value_and_grads(fn):
        inputs = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D, bias)]
        value = fn(*inputs)
        return value, torch.autograd.grad(value, inputs)

    eager = value_and_grads(loss)
    traced = []

    def recording(gm, example_inputs):
        op = torch.ops.mamba2_cutile.ssd_fwd.default
        traced.extend(node.args[-1] for node in gm.graph.nodes if node.target is op)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    compiled = value_and_grads(torch.compile(loss, fullgraph=True, backend=recording))
    assert traced == [backward]
    torch.testing.assert_close(compiled[0], eager[0])
    for got, want in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(got, want)


def test_cutile_backward_glue_with_reference_passes(reference_stages):
    """The backward="cutile" path of the op (casts, absent inputs, layouts), its passes swapped for the
    reference stages so it runs here: it must give the reference path's gradients in the inputs' dtypes, with the
    shapes and dtypes its fake implementation promises torch.compile."""
    torch.manual_seed(1)
    b, l, h, p, g, n = 2, 37, 4, 8, 2, 6
    x, B, C = torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n)
    dt, A, D, bias, init = (
        torch.randn(b, l, h),
        -torch.rand(h) - 0.1,
        torch.randn(h),
        torch.randn(h),
        torch.randn(b, h, p, n),
    )
    dy = torch.randn(b, l, h, p).transpose(0, 1).contiguous().transpose(0, 1)  # not contiguous
    fake = cutile_ssd._ssd_gradients_fake

    def like(tensors):  # what torch.compile traces with: shapes and dtypes
        return [(t.shape, t.dtype) for t in tensors]

    for dfinal, seq_idx in (
        (torch.randn(b, h, p, n), None),
        (None, None),
        (torch.randn(b, h, p, n), documents(b, l, 16, 4)),
    ):
        got = cutile_ssd.ssd_bwd(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, seq_idx, "cutile")
        want = cutile_ssd.ssd_bwd(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, seq_idx, "reference")
        for a, w in zip(got, want, strict=True):
            torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-5)
            assert a.dtype == w.dtype and a.is_contiguous()
        assert like(got) == like(fake(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, seq_idx, ""))
    absent = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, 16, None, None, False, None, None, "cutile")
    assert absent[5].numel() == 0 and absent[4].shape == (3, h) and not absent[4][1:].any()
    assert like(absent) == like(fake(dy, None, x, dt, A, B, C, 16, None, None, False, None, None, ""))


def test_cutile_backward_runs_at_its_own_chunk_size(reference_stages, monkeypatch):
    """Forward chunk 128 or 256: the cuTile backward's passes see BACKWARD_CHUNK-token chunks and still
    give the gradients of the forward's chunked form (float64, reference passes swapped in), also with document
    boundaries: the masks at the backward's chunks are those of the same documents."""
    seen = []
    stage_1 = cutile_ssd.chunk_cumsum_log2

    def chunk_cumsum_log2(dt, A, chunk_size, *rest):
        seen.append(chunk_size)
        return stage_1(dt, A, chunk_size, *rest)

    monkeypatch.setattr(cutile_ssd, "chunk_cumsum_log2", chunk_cumsum_log2)
    torch.manual_seed(2)
    b, l, h, p, g, n = 1, 300, 2, 4, 1, 4
    f64 = torch.float64
    x, B, C = torch.randn(b, l, h, p, dtype=f64), torch.randn(b, l, g, n, dtype=f64), torch.randn(b, l, g, n, dtype=f64)
    dt, A, dy = torch.randn(b, l, h, dtype=f64), -torch.rand(h, dtype=f64) - 0.1, torch.randn(b, l, h, p, dtype=f64)
    for chunk, seq_idx in ((128, None), (256, None), (128, documents(b, l, 128, seed=5))):
        seen.clear()
        got = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, chunk, None, None, True, None, seq_idx, "cutile")
        want = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, chunk, None, None, True, None, seq_idx, "reference")
        assert seen == [BACKWARD_CHUNK]
        for a, w in zip(got[:5], want[:5]):
            torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-10)


WALK_LAUNCHES = {
    "aside": [
        "second waits for current",
        "fwd_pass_state on second",
        "bwd_pass_state on current",
        "bwd_dx on current",
        "current waits for second",
    ],
    "one stream": ["fwd_pass_state on current", "bwd_pass_state on current", "bwd_dx on current"],
    "one launch": ["state_walks on current", "bwd_dx on current"],
}


@pytest.mark.parametrize("walks", list(WALK_LAUNCHES))
def test_the_backward_walks_run_as_walks_says(monkeypatch, walks):
    """The cuTile backward's launches and stream waits, recorded with the launches mocked on CPU tensors. "aside":
    the state recompute goes to the device's second stream after it waits for the current one, and bwd_dbc, which
    reads the recomputed states, to the current stream after it waits for the second. "one stream": every launch on
    the current stream, nothing waits. "one launch" (the default): both walks in one kernel, a grid of twice the
    (batch, head) pairs. An unknown mode is refused by name."""
    import contextlib

    import cuda.tile as ct

    from kernels.cutile import launch as launch_module
    from kernels.cutile import state_walks, tuning

    class Stream:
        def __init__(self, name: str):
            self.name = name

        def wait_stream(self, other: Stream) -> None:
            events.append(f"{self.name} waits for {other.name}")

    events: list[str] = []
    grids: dict[str, tuple] = {}
    current = [Stream("current")]

    @contextlib.contextmanager
    def on(stream: Stream):
        current.append(stream)
        yield
        current.pop()

    def launch(stream, grid, kernel, args, **options):
        name = kernel._pyfunc.__name__.removesuffix("_kernel")
        grids[name] = grid
        events.append(f"{name} on {stream.name}")

    monkeypatch.setattr(ct, "launch", launch)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(launch_module, "raw_stream", lambda device: current[-1])  # what launches take
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream("second"))
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "cpu")
    monkeypatch.setitem(tuning._state, "chosen", {})  # the launches' choices stay in this test
    monkeypatch.setattr(state_walks, "_second_streams", {})
    b, l, h, p, n = 1, 128, 2, 16, 16
    x, dy, B, C = torch.randn(b, l, h, p), torch.randn(b, l, h, p), torch.randn(b, l, 1, n), torch.randn(b, l, 1, n)
    dt, A = torch.rand(b, l, h), -torch.rand(h)
    cutile_ssd.ssd_backward(dy, None, x, dt, A, B, C, 64, walks=walks)
    assert events == [
        "chunk_cumsum on current",
        *WALK_LAUNCHES[walks],
        "bwd_dbc on current",
        "chunk_cumsum_bwd on current",
    ]
    if walks == state_walks.DEFAULT_WALKS:
        events.clear()
        cutile_ssd.ssd_backward(dy, None, x, dt, A, B, C, 64)
        assert events[1:-2] == WALK_LAUNCHES[walks]
    if walks == "one launch":
        assert grids["state_walks"][0] == 2 * b * h
    with pytest.raises(ValueError, match=r"walks must be one of .* got 'interleaved'"):
        cutile_ssd.ssd_backward(dy, None, x, dt, A, B, C, 64, walks="interleaved")
