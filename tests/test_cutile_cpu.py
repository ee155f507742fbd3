"""The cuTile backend where no GPU is: every kernel still compiles for Hopper and Blackwell, the
toolchain check says what is wrong, and the backward op's reference path equals autograd."""

from __future__ import annotations

import dataclasses
import inspect
import re
import stat

import pytest
import torch

from bench import aot
from kernels.cutile import ssd as cutile_ssd
from kernels.cutile import toolchain


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_every_kernel_compiles_to_a_cubin(arch):
    sizes = aot.export_all(arch)
    names = {label.split("[")[0] for label in sizes}
    ssd = {"chunk_cumsum", "fwd_pass_state", "compute_out", "bwd_pass_state", "state_walks", "bwd_dx", "bwd_dbc"}
    ssd.add("chunk_cumsum_bwd")
    assert names == ssd | {"conv_fwd", "conv_bwd_gv", "conv_bwd_dx", "norm_fwd", "norm_bwd"}
    every = list(aot.every_signature())
    assert len(sizes) == len(every) == len({label for label, _, _ in every})
    assert all(size > 1000 for size in sizes.values())


def test_ci_builds_each_kernel_with_its_default_hints():
    """A launch compiles the kernel with its configuration's occupancy hint; CI builds each default's."""
    from kernels.cutile import bwd_dx, causal_conv, chunk_cumsum_bwd, compute_out, fwd_pass_state, rms_norm

    bf16 = torch.bfloat16
    defaults = {
        "fwd_pass_state": fwd_pass_state.default_state_config(bf16, 64, 128, 128).occupancy,
        "compute_out": compute_out.default_out_config(bf16).occupancy,
        "bwd_pass_state": fwd_pass_state.StateConfig().occupancy,
        "state_walks": fwd_pass_state.StateConfig().occupancy,
        "bwd_dx": bwd_dx.default_dx_config(bf16).occupancy,
        "chunk_cumsum_bwd": chunk_cumsum_bwd.CumsumBwdConfig().occupancy,
        "conv_fwd": causal_conv.DEFAULT_FWD.occupancy,
        "conv_bwd_gv": causal_conv.DEFAULT_BWD.occupancy,
        "norm_fwd": rms_norm.DEFAULT_FWD.occupancy,
        "norm_bwd": rms_norm.DEFAULT_BWD.occupancy,
    }
    labels = [label for label, _, _ in aot.every_signature()]
    for name, occupancy in defaults.items():
        assert occupancy > 1, name  # tuned defaults all take a hint; a 1 would leave nothing to check here
        assert any(lab.startswith(f"{name}[bfloat16") and f"occupancy={occupancy}]" in lab for lab in labels), name


def _fake_ptxas(directory, release: str):
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    ptxas = bin_dir / "ptxas"
    ptxas.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    ptxas.chmod(ptxas.stat().st_mode | stat.S_IEXEC)
    return directory


def test_old_toolkit_in_cuda_home_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(_fake_ptxas(tmp_path / "cuda-12.0", "12.0")))
    toolchain.problem.cache_clear()
    try:
        assert re.search(r"CUDA_HOME=.*cuda-12.0 holds ptxas 12.0, older than tileiras", toolchain.problem())
    finally:
        toolchain.problem.cache_clear()


def test_new_enough_toolkit_in_cuda_home_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(_fake_ptxas(tmp_path / "cuda-99.0", "99.0")))
    toolchain.problem.cache_clear()
    try:
        assert toolchain.problem() is None
    finally:
        toolchain.problem.cache_clear()


def test_missing_compiler_is_named(monkeypatch):
    monkeypatch.setattr(toolchain, "_tileiras_path", lambda: None)
    toolchain.problem.cache_clear()
    try:
        assert re.search(r"tileiras.*pip install 'cuda-tile\[tileiras\]'", toolchain.problem())
    finally:
        toolchain.problem.cache_clear()


def test_cpu_tensors_are_refused_by_the_kernels_wrapper():
    x = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="is on cpu; move the inputs to a CUDA device"):
        B, C = torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4)
        inputs = {"x": x, "dt": torch.rand(1, 8, 2), "A": -torch.ones(2), "B": B, "C": C}
        cutile_ssd.check_inputs(inputs | {"D": None, "dt_bias": None, "initial_states": None}, 64, "reference")


def test_bad_backward_is_refused():
    """An unknown backward name, and the cutile backward asked of another backend: one clear line each."""
    import kernels

    x = torch.randn(1, 8, 2, 4)
    args = (torch.rand(1, 8, 2), -torch.ones(2), torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4))
    with pytest.raises(ValueError, match=r"backward must be one of reference, cutile, got 'bogus'"):
        kernels.ssd(x, *args, 16, backend="torch", backward="bogus")
    with pytest.raises(ValueError, match="backward='cutile' needs the cutile backend; the torch backend has its own"):
        kernels.ssd(x, *args, 16, backend="torch", backward="cutile")


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

    def op(dy, dfinal, x, B, C):  # the op's reference backward, in the inputs' order (as closed_form's)
        return by_input(cutile_ssd.ssd_bwd(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, "reference"), D, bias)

    def closed_form(dy, dfinal, x, B, C):
        return by_input(ssd_backward(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init), D, bias)

    for got, w in zip(op(dy, dfinal, x, B, C), closed_form(dy, dfinal, x, B, C), strict=True):
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
    absent = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, 16, None, None, True, None, "reference")
    assert absent[5].numel() == 0 and absent[4].shape == (3, h) and not absent[4][1:].any()


def test_cutile_passes_keep_the_reference_passes_contracts():
    """Each stage the cuTile backward composes takes the arguments of its reference stage, by name, order and
    default (the GPU tests compare their results), and is a kernel CI compiles. A stage may take more after
    them, each with a default (bwd_dx: dA_log2, which the cuTile chunk_cumsum pass returns third)."""
    from kernels.reference_backward import REFERENCE, Passes

    compiled = {label.split("[")[0] for label, _, _ in aot.every_signature()}
    for stage in Passes._fields:
        ours, reference = getattr(cutile_ssd.CUTILE, stage), getattr(REFERENCE, stage)
        params = [(p.name, p.default) for p in inspect.signature(ours).parameters.values()]
        want = [(p.name, p.default) for p in inspect.signature(reference).parameters.values()]
        assert params[: len(want)] == want, stage
        assert all(default is not inspect.Parameter.empty for _, default in params[len(want) :]), stage
        assert ours.__module__ == f"kernels.cutile.{stage}" and stage in compiled, stage
    assert [p for p in inspect.signature(cutile_ssd.CUTILE.bwd_dx).parameters][-1] == "dA_log2"


def test_backward_hands_stage_1s_third_output_to_bwd_dx():
    """ssd_backward passes what a chunk_cumsum pass returns after dt_out and dA_cumsum to bwd_dx, last (the cuTile
    passes: dA_cumsum·log2(e) from chunk_cumsum's launch); passes returning two give bwd_dx nothing more."""
    from kernels import reference_backward

    handed = []

    def chunk_cumsum(dt, A, chunk_size, *rest):
        dt_out, dA_cumsum = reference_backward.REFERENCE.chunk_cumsum(dt, A, chunk_size, *rest)
        return dt_out, dA_cumsum, dA_cumsum * 2.0

    def bwd_dx(x, dy, B, C, dt_out, dA_cumsum, dstates, D=None, *more):
        handed.append((dA_cumsum, more))
        return reference_backward.REFERENCE.bwd_dx(x, dy, B, C, dt_out, dA_cumsum, dstates, D)

    torch.manual_seed(3)
    b, l, h, p, g, n = 1, 40, 2, 4, 1, 4
    x, B, C = torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n)
    dt, A, dy = torch.randn(b, l, h), -torch.rand(h) - 0.1, torch.randn(b, l, h, p)
    passes = reference_backward.REFERENCE._replace(bwd_dx=bwd_dx)
    want = reference_backward.ssd_backward(dy, None, x, dt, A, B, C, 16, passes=passes)
    assert len(handed) == 1 and handed[0][1] == ()
    got = reference_backward.ssd_backward(
        dy, None, x, dt, A, B, C, 16, passes=passes._replace(chunk_cumsum=chunk_cumsum)
    )
    (dA_cumsum, (third,)) = handed[1]
    torch.testing.assert_close(third, dA_cumsum * 2.0)
    for a, w in zip(got, want):
        assert (a is None and w is None) or torch.equal(a, w)


def test_unused_outputs_reach_the_backward_as_none(monkeypatch):
    """The op's autograd context does not materialize gradients: a final state the loss does not use reaches
    _backward and ssd_bwd as None (no fill of zeros, and bwd_pass_state starts from zero without a load)."""

    class Ctx:
        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

        def set_materialize_grads(self, value):
            self.materialize = value

    ctx = Ctx()
    t = torch.zeros(1)
    cutile_ssd._setup_context(ctx, (t, t, t, t, t, 64, None, None, True, None, "cutile"), (t, t))
    assert ctx.materialize is False and ctx.backward == "cutile"

    received = []

    def ssd_bwd(dy, dfinal, *rest):
        received.append(dfinal)
        return [torch.ones(1)] * 4 + [torch.ones(3, 1), torch.ones(1)]

    monkeypatch.setattr(cutile_ssd, "ssd_bwd", ssd_bwd)
    grads = cutile_ssd._backward(ctx, torch.ones(1), None)
    assert received == [None]
    # dx, ddt, dA, dB, dC; then chunk_size, D, dt_bias, dt_softplus, initial_states, backward: None (D, dt_bias and
    # initial_states absent here, the rest not tensors)
    assert [g is None for g in grads] == [False] * 5 + [True] * 6


@pytest.fixture
def reference_stages(monkeypatch):
    """kernels.cutile.ssd with every cuTile stage and pass replaced by its reference (same contracts), so its host
    code runs on CPU tensors."""
    from kernels import reference, reference_backward

    for name in ("chunk_cumsum", "fwd_pass_state", "compute_out"):
        monkeypatch.setattr(cutile_ssd, name, getattr(reference, name))
    monkeypatch.setattr(cutile_ssd, "CUTILE", reference_backward.REFERENCE)
    monkeypatch.setattr(cutile_ssd, "check_inputs", lambda tensors, chunk_size, backward: None)


@pytest.mark.parametrize("backward", ["reference", "cutile"])
def test_eager_path_is_a_function_with_autograds_gradients(reference_stages, backward):
    """Outside torch.compile the cutile backend is the autograd.Function EagerSSD over the ops' bodies: its outputs
    and the gradient of every input equal autograd's through kernels.reference.ssd_chunked, with the final state
    in the loss and without it (its gradient then reaches the backward as None)."""
    from kernels import reference

    torch.manual_seed(2)
    b, l, h, p, g, n = 2, 37, 4, 8, 2, 6
    x, B, C, dt = torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n), torch.randn(b, l, h)
    A, D, bias, init = -torch.rand(h) - 0.1, torch.randn(h), torch.randn(h), torch.randn(b, h, p, n)
    inputs = [t.requires_grad_() for t in (x, dt, A, B, C, D, bias, init)]
    dy, dfinal = torch.randn(b, l, h, p), torch.randn(b, h, p, n)

    def outputs_and_grads(fn, use_final):
        x, dt, A, B, C, D, bias, init = inputs
        y, final = fn(x, dt, A, B, C, 16, D, bias, True, init, *([backward] if fn is cutile_ssd.ssd_cutile else []))
        loss = (y * dy).sum() + ((final * dfinal).sum() if use_final else 0)
        return y, final, torch.autograd.grad(loss, inputs)

    for use_final in (True, False):
        y, final, grads = outputs_and_grads(cutile_ssd.ssd_cutile, use_final)
        assert type(y.grad_fn).__name__ == "EagerSSDBackward"
        want_y, want_final, want_grads = outputs_and_grads(reference.ssd_chunked, use_final)
        torch.testing.assert_close(y, want_y)
        torch.testing.assert_close(final, want_final)
        for name, got, want in zip(("x", "dt", "A", "B", "C", "D", "dt_bias", "init"), grads, want_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("backward", ["reference", "cutile"])
def test_compiled_and_eager_paths_agree(reference_stages, monkeypatch, backward):
    """torch.compile(fullgraph=True) traces ssd_cutile as the custom ops (no graph break), and the compiled forward
    and backward give the eager path's outputs and gradients (here on the CPU, through the same bodies with the
    reference stages; the op's CPU kernel is its body, which refuses CPU tensors unless its checks are replaced)."""
    cutile_ssd.ssd_fwd.register_kernel("cpu")(cutile_ssd.ssd_forward)
    torch.manual_seed(3)
    b, l, h, p, g, n = 1, 40, 2, 8, 1, 4
    x, B, C, dt = torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n), torch.randn(b, l, h)
    A, D, bias = -torch.rand(h) - 0.1, torch.randn(h), torch.randn(h)

    def loss(x, dt, A, B, C, D, bias):
        y, final = cutile_ssd.ssd_cutile(x, dt, A, B, C, 16, D, bias, True, None, backward)
        return y.square().sum() + final.sum()

    def value_and_grads(fn):
        inputs = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D, bias)]
        value = fn(*inputs)
        return value, torch.autograd.grad(value, inputs)

    eager = value_and_grads(loss)
    traced, op = [], cutile_ssd.ssd_fwd

    def ssd_fwd(*args):  # torch.compile traces through this; EagerSSD would be traced as a Function instead
        traced.append(args[-1])
        return op(*args)

    monkeypatch.setattr(cutile_ssd, "ssd_fwd", ssd_fwd)
    torch._dynamo.reset()
    compiled = value_and_grads(torch.compile(loss, fullgraph=True, backend="aot_eager"))
    assert traced == [backward]
    torch.testing.assert_close(compiled[0], eager[0])
    for got, want in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(got, want)


def test_tuning_choice_is_decided_once_per_shape(tmp_path, monkeypatch):
    """The launch path looks a tuned configuration up once; later calls touch neither the GPU nor the disk."""
    from kernels.cutile import tuning
    from kernels.cutile.compute_out import OutConfig

    lookups = []
    monkeypatch.setattr(tuning, "_gpu_key", lambda device: lookups.append(device) or "TestGPU|cuda-tile-x")
    tuning.set_cache_path(tmp_path / "tuning.json")
    try:
        (tmp_path / "tuning.json").write_text(
            '{"compute_out|s1|TestGPU|cuda-tile-x": {"config": {"TILE_T": 128, "TILE_P": 32, "latency": 4, '
            '"occupancy": 1}}}'
        )
        never = lambda: pytest.fail("no search when tuning is off")
        space = lambda: [OutConfig(), OutConfig(128, 32, 4, 1)]  # tuning off: only checks the cached entry
        for _ in range(3):
            assert tuning.choose("compute_out", "s1", OutConfig(), space, "cuda:0", None) == OutConfig(128, 32, 4, 1)
            assert tuning.choose("compute_out", "s2", OutConfig(), never, "cuda:0", None) == OutConfig()
        assert len(lookups) == 2  # one per shape
        assert tuning.chosen() == {  # what the process ran, for the record
            "compute_out|s1": {
                "config": dataclasses.asdict(OutConfig(128, 32, 4, 1)),
                "source": "cache",
                "mean_us": None,
            },
            "compute_out|s2": {"config": dataclasses.asdict(OutConfig()), "source": "default", "mean_us": None},
        }
        # An entry written for another layout of the configuration (a field since removed) is not used.
        (tmp_path / "tuning.json").write_text(
            '{"compute_out|s3|TestGPU|cuda-tile-x": {"config": {"TILE_T": 128, "TILE_P": 32, "stages": 2}}}'
        )
        tuning.set_cache_path(tmp_path / "tuning.json")
        assert tuning.choose("compute_out", "s3", OutConfig(), never, "cuda:0", None) == OutConfig()
        # Nor is one outside today's tune space (tuned by older code): tuning off, the default runs.
        (tmp_path / "tuning.json").write_text(
            '{"compute_out|s4|TestGPU|cuda-tile-x": {"config": {"TILE_T": 16, "TILE_P": 16, "latency": 4, '
            '"occupancy": 1}}}'
        )
        tuning.set_cache_path(tmp_path / "tuning.json")
        assert tuning.choose("compute_out", "s4", OutConfig(), space, "cuda:0", None) == OutConfig()
    finally:
        tuning.set_cache_path(None)


def test_tuning_searches_again_when_the_tune_space_changed(tmp_path, monkeypatch):
    """With tuning on, a cached choice is kept only if it was searched over today's tune space: one from a smaller
    space (as before fwd_pass_state's two-chunk walks joined its space) or from before spaces were recorded is
    searched again, and the new entry, recording its space, is then used as it is."""
    import types

    import cuda.tile.tune

    from kernels.cutile import tuning
    from kernels.cutile.compute_out import OutConfig

    searched = []

    def search(candidates, stream, **kwargs):
        searched.append(list(candidates))
        best = types.SimpleNamespace(config=candidates[-1], mean_us=1.0)
        return types.SimpleNamespace(best=best, successes=candidates, failures=[], summary=lambda top_k: "")

    monkeypatch.setattr(cuda.tile.tune, "exhaustive_search", search)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "TestGPU|cuda-tile-x")
    old = [OutConfig(), OutConfig(128, 32, 4, 1)]
    grown = [*old, OutConfig(64, 64)]
    entry = (
        '{"compute_out|s1|TestGPU|cuda-tile-x": {"config": {"TILE_T": 128, "TILE_P": 32, "latency": 4, '
        '"occupancy": 1}%s}}'
    )
    cache = tmp_path / "tuning.json"

    def choose() -> OutConfig:
        tuning.set_cache_path(cache)  # forgets the process's choices: the cache on disk decides
        searched.clear()
        return tuning.choose("compute_out", "s1", OutConfig(), lambda: grown, "cuda:0", lambda cfg: ((), None, ()))

    tuning.set_autotune(True)
    try:
        for recorded in ("", f', "space": "{tuning.space_id(old)}"'):  # no space recorded; a smaller one
            cache.write_text(entry % recorded)
            assert choose() == OutConfig(64, 64) and searched == [grown]
            assert choose() == OutConfig(64, 64) and searched == []  # the stored entry, searched over today's space
        cache.write_text(entry % f', "space": "{tuning.space_id(grown)}"')
        assert choose() == OutConfig(128, 32, 4, 1) and searched == []
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)


def test_precompiling_launches_the_nth_candidate_and_remembers_nothing(tmp_path, monkeypatch):
    """tuning.precompiling(k) makes every launch run the k-th configuration of its tune space (the default past
    its end), reports each space's size, neither tunes nor writes the cache, and leaves tuning as it was."""
    from kernels.cutile import tuning
    from kernels.cutile.bwd_dx import DxConfig
    from kernels.cutile.compute_out import OutConfig

    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "TestGPU|cuda-tile-x")
    tuning.set_cache_path(tmp_path / "tuning.json")
    outs = [OutConfig(TILE_T=t) for t in (16, 32, 64)]
    never = lambda: pytest.fail("no search when tuning is off")
    try:
        tuning.set_autotune(True)  # on: precompiling must still not search
        for k, want in ((0, outs[0]), (2, outs[2]), (3, OutConfig())):
            with tuning.precompiling(k) as sizes:
                assert tuning.choose("compute_out", "s1", OutConfig(), lambda: outs, "cuda:0", None) == want
                assert tuning.choose("bwd_dx", "s1", DxConfig(), lambda: [DxConfig(1)], "cuda:0", None) == (
                    DxConfig(1) if k == 0 else DxConfig()
                )
            assert sizes == {"compute_out": 3, "bwd_dx": 1}
        assert tuning.chosen() == {} and not (tmp_path / "tuning.json").exists()
        tuning.set_autotune(False)
        assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == OutConfig()
        with pytest.raises(ValueError, match="index must be >= 0"), tuning.precompiling(-1):
            pass
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)


def test_a_forced_configuration_replaces_tuning_for_its_stage_only(tmp_path, monkeypatch):
    """tuning.forced pins one stage's configuration within its block, records what each launch of that stage
    ran, leaves other stages to tuning, and restores tuning's choice after the block."""
    from kernels.cutile import tuning
    from kernels.cutile.bwd_dx import DxConfig
    from kernels.cutile.compute_out import OutConfig

    monkeypatch.setattr(tuning, "_gpu_key", lambda device: "TestGPU|cuda-tile-x")
    tuning.set_cache_path(tmp_path / "tuning.json")
    never = lambda: pytest.fail("no search when tuning is off")
    pinned = OutConfig(TILE_T=32)
    try:
        with tuning.forced("compute_out", pinned) as launched:
            assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == pinned
            assert tuning.choose("bwd_dx", "s1", DxConfig(), never, "cuda:0", None) == DxConfig()
            with tuning.forced("compute_out") as inner:  # None: record what tuning chooses
                assert tuning.choose("compute_out", "s2", OutConfig(), never, "cuda:0", None) == OutConfig()
            assert tuning.choose("compute_out", "s2", OutConfig(), never, "cuda:0", None) == pinned
        assert launched == [pinned, pinned] and inner == [OutConfig()]
        assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == OutConfig()
        # A pinned configuration is not tuned first (tuning on: `never` would fail), and an error inside the
        # block leaves nothing pinned.
        tuning.set_autotune(True)
        with pytest.raises(RuntimeError, match="inside"), tuning.forced("compute_out", pinned):
            assert tuning.choose("compute_out", "s9", OutConfig(), never, "cuda:0", None) == pinned
            raise RuntimeError("inside")
        tuning.set_autotune(False)
        assert tuning.choose("compute_out", "s1", OutConfig(), never, "cuda:0", None) == OutConfig()
    finally:
        tuning.set_autotune(False)
        tuning.set_cache_path(None)


def test_cutile_backward_glue_with_reference_passes(monkeypatch):
    """The backward="cutile" path of the op (casts, absent inputs, layouts), its passes swapped for the
    reference stages so it runs here: it must give the reference path's gradients in the inputs' dtypes, with the
    shapes and dtypes its fake implementation promises torch.compile."""
    from kernels import reference_backward

    monkeypatch.setattr(cutile_ssd, "CUTILE", reference_backward.REFERENCE)
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

    def like(tensors):  # what torch.compile traces with: shapes and dtypes
        return [(t.shape, t.dtype) for t in tensors]

    for dfinal in (torch.randn(b, h, p, n), None):
        got = cutile_ssd.ssd_bwd(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, "cutile")
        want = cutile_ssd.ssd_bwd(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, "reference")
        for a, w in zip(got, want, strict=True):
            torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-5)
            assert a.dtype == w.dtype and a.is_contiguous()
        assert like(got) == like(cutile_ssd._ssd_bwd_fake(dy, dfinal, x, dt, A, B, C, 16, D, bias, True, init, ""))
    absent = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, 16, None, None, False, None, "cutile")
    assert absent[5].numel() == 0 and absent[4].shape == (3, h) and not absent[4][1:].any()
    assert like(absent) == like(cutile_ssd._ssd_bwd_fake(dy, None, x, dt, A, B, C, 16, None, None, False, None, ""))


def test_cutile_backward_runs_at_its_own_chunk_size(monkeypatch):
    """Forward chunk 128 or 256: the cuTile backward's passes see BACKWARD_CHUNK-token chunks and still
    give the gradients of the forward's chunked form (float64, reference passes swapped in)."""
    from kernels import reference_backward

    seen = []

    def chunk_cumsum(dt, A, chunk_size, *rest):
        seen.append(chunk_size)
        return reference_backward.REFERENCE.chunk_cumsum(dt, A, chunk_size, *rest)

    monkeypatch.setattr(cutile_ssd, "CUTILE", reference_backward.REFERENCE._replace(chunk_cumsum=chunk_cumsum))
    torch.manual_seed(2)
    b, l, h, p, g, n = 1, 300, 2, 4, 1, 4
    f64 = torch.float64
    x, B, C = torch.randn(b, l, h, p, dtype=f64), torch.randn(b, l, g, n, dtype=f64), torch.randn(b, l, g, n, dtype=f64)
    dt, A, dy = torch.randn(b, l, h, dtype=f64), -torch.rand(h, dtype=f64) - 0.1, torch.randn(b, l, h, p, dtype=f64)
    for chunk in (128, 256):
        seen.clear()
        got = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, chunk, None, None, True, None, "cutile")
        want = cutile_ssd.ssd_bwd(dy, None, x, dt, A, B, C, chunk, None, None, True, None, "reference")
        assert seen == [cutile_ssd.BACKWARD_CHUNK]
        for a, w in zip(got[:5], want[:5]):
            torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_bf16_tuned_defaults_stay_with_bf16_inputs(dtype, monkeypatch):
    """bwd_dx's occupancy 2, its G scaled to log2 units on the host, compute_out's TILE_T 128 and fwd_pass_state's
    two-chunk 64 x 32 walk at occupancy 4 were measured with bf16 inputs only: other dtypes get the earlier forms
    (the host-scaled fp32 bwd_dx hung on the GPU at head dim 64), and tuning never offers float32 inputs bwd_dx at
    occupancy 2 (not measured, and the fp32 kernel sits at the register limit there: 255 registers, 8 bytes of stack
    with D at sm_90). Checked through the host functions, with launch() recording what it gets and the arguments of
    its default's launch."""
    from kernels.cutile import bwd_dx as dx_module
    from kernels.cutile import compute_out as out_module
    from kernels.cutile import fwd_pass_state as state_module

    got = {}

    def record(name, key, default, space, spec, device):
        got[name] = (default, space(), spec(default)[2])
        return default

    monkeypatch.setattr(dx_module, "launch", record)
    monkeypatch.setattr(out_module, "launch", record)
    monkeypatch.setattr(state_module, "launch", record)
    b, l, h, p, g, n, Q = 1, 64, 2, 64, 1, 64, 64
    x, dy = torch.zeros(b, l, h, p, dtype=dtype), torch.zeros(b, l, h, p, dtype=dtype)
    B, C = torch.zeros(b, l, g, n, dtype=dtype), torch.zeros(b, l, g, n, dtype=dtype)
    rows, states = torch.ones(b, h, 1, Q), torch.zeros(b, 1, h, p, n)
    dx_module.bwd_dx(x, dy, B, C, rows, rows, states, torch.zeros(h))
    out_module.compute_out(x, B, C, rows, rows, states, torch.zeros(h))
    state_module.fwd_pass_state(x, B, rows, rows)
    (dx_default, dx_space, dx_args), (out_default, _, _) = got["bwd_dx"], got["compute_out"]
    state_default, state_space, _ = got["fwd_pass_state"]
    bf16 = dtype == torch.bfloat16
    # the kernel's dA_cumsum argument (after dt_out) and its last flag, G_LOG2, before the chunks a program takes and
    # the last chunk's index
    assert dx_args[-3] is bf16 and dx_args[-2:] == (dx_default.chunks, 0)
    assert torch.equal(dx_args[5], rows.view(b, h, Q) * (dx_module.LOG2E if bf16 else 1.0))
    # given the log2 copy (the SSD's backward: chunk_cumsum_log2 wrote it), bf16 takes it as it is, no host multiply
    log2 = torch.full((b, h, 1, Q), 3.0)
    dx_module.bwd_dx(x, dy, B, C, rows, rows, states, torch.zeros(h), log2)
    assert got["bwd_dx"][2][5].data_ptr() == (log2 if bf16 else rows).data_ptr()
    assert dx_default.occupancy == (2 if bf16 else 1)
    assert out_default.TILE_T == (128 if bf16 else 64) and out_default.blocks == (2 if bf16 else 1)
    assert any(c.occupancy == 2 for c in dx_space) == (dtype != torch.float32)
    two_chunk_walk = state_module.StateConfig(TILE_P=64, TILE_N=32, latency=4, occupancy=4, chunks_per_step=2)
    assert state_default == (two_chunk_walk if bf16 else state_module.StateConfig())
    assert state_default in state_space  # a default tuning can also pick
    # chunks of 256 (two-chunk walks spill there) and head dims below 64 keep the one-chunk default
    for head_dim, chunk in ((64, 256), (32, 128)):
        assert state_module.default_state_config(dtype, head_dim, 128, chunk) == state_module.StateConfig()


def test_the_forward_walk_takes_one_or_two_chunks_an_iteration(monkeypatch):
    """fwd_pass_state's kernel forms one or two chunks' products an iteration; a configuration asking for more (a
    forced one, or a cache written by other code) is refused with its name, not run as a wrong walk."""
    from kernels.cutile import fwd_pass_state as state_module
    from kernels.cutile.fwd_pass_state import StateConfig

    specs = {}

    def record(name, key, default, space, spec, device):
        specs.update({k: spec(StateConfig(64, 32, 4, 2, k)) for k in (1, 2)})
        spec(StateConfig(64, 32, 4, 2, 3))

    monkeypatch.setattr(state_module, "launch", record)
    b, l, h, p, n, Q = 1, 256, 2, 64, 32, 64
    x, B, rows = torch.zeros(b, l, h, p), torch.zeros(b, l, 1, n), torch.zeros(b, h, l // Q, Q)
    with pytest.raises(ValueError, match="fwd_pass_state walks 1 or 2 chunks an iteration, not 3"):
        state_module.fwd_pass_state(x, B, rows, rows)
    assert [specs[k][2][-1] for k in (1, 2)] == [1, 2]  # the kernel's STEP


def test_cutile_conv_names_what_it_cannot_take():
    from kernels.cutile.causal_conv import causal_conv1d_silu

    x, w, b = torch.zeros(1, 8, 4), torch.zeros(4, 4), torch.zeros(4)
    with pytest.raises(ValueError, match="cutile conv: x is on cpu; move it to a CUDA device"):
        causal_conv1d_silu(x, w, b, [4])
    with pytest.raises(ValueError, match=r"x must be \(b, l, c\) and weight \(c, k\), got \(1, 8, 4\) and \(5, 4\)"):
        causal_conv1d_silu(x, torch.zeros(5, 4), b, [4])
    with pytest.raises(ValueError, match=r"bias must be \(4,\), got \(3,\)"):
        causal_conv1d_silu(x, w, torch.zeros(3), [4])
    with pytest.raises(ValueError, match="cutile conv: kernel width 5 is above the 4 its backward takes"):
        causal_conv1d_silu(x, torch.zeros(4, 5), b, [4])
    with pytest.raises(ValueError, match=r"cutile conv: sizes \[2, 3\] must be positive and add up to the 4 channels"):
        causal_conv1d_silu(x, w, b, [2, 3])


def test_cutile_norm_names_what_it_cannot_take():
    from kernels.cutile.rms_norm import rms_norm

    x, w = torch.zeros(2, 8, 64), torch.ones(64)
    with pytest.raises(ValueError, match="cutile rms_norm: x is on cpu; move it to a CUDA device"):
        rms_norm(x, w, 1e-5, None, 64, torch.float32)
    with pytest.raises(ValueError, match="dim 64 is not a multiple of the group size 48"):
        rms_norm(x, w, 1e-5, None, 48, torch.float32)
    with pytest.raises(ValueError, match="group size 40 must be a multiple of 16"):
        rms_norm(torch.zeros(2, 80), torch.ones(80), 1e-5, None, 40, torch.float32)
    with pytest.raises(ValueError, match=r"weight \(d,\), z like x or None; got \(\(2, 8, 64\), \(64,\), \(2, 8\)\)"):
        rms_norm(x, w, 1e-5, torch.zeros(2, 8), 64, torch.float32)


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
    the current stream, nothing waits. "one launch": both walks in one kernel, a grid of twice the (batch, head)
    pairs. An unknown mode is refused by name."""
    import contextlib

    import cuda.tile as ct

    from kernels.cutile import launch as launch_module
    from kernels.cutile import state_walks, tuning
    from kernels.reference_backward import ssd_backward

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
    monkeypatch.setattr(state_walks, "WALKS", walks)
    b, l, h, p, n = 1, 128, 2, 16, 16
    x, dy, B, C = torch.randn(b, l, h, p), torch.randn(b, l, h, p), torch.randn(b, l, 1, n), torch.randn(b, l, 1, n)
    dt, A = torch.rand(b, l, h), -torch.rand(h)
    ssd_backward(dy, None, x, dt, A, B, C, 64, passes=cutile_ssd.CUTILE)
    assert events == [
        "chunk_cumsum on current",
        *WALK_LAUNCHES[walks],
        "bwd_dbc on current",
        "chunk_cumsum_bwd on current",
    ]
    if walks == "one launch":
        assert grids["state_walks"][0] == 2 * b * h
    monkeypatch.setattr(state_walks, "WALKS", "interleaved")
    with pytest.raises(ValueError, match=r"WALKS must be one of .* got 'interleaved'"):
        ssd_backward(dy, None, x, dt, A, B, C, 64, passes=cutile_ssd.CUTILE)
