"""bench/probe_layer.py's check, on the CPU: a module computing the layer right passes, one that is wrong in
a single gradient fails, and variant files load without their torch.library registrations (no autograd
registration, so the production op names keep their functions)."""

from __future__ import annotations

import re
import types

import torch

from bench import probe_layer
from model.layers import causal_conv1d_silu, rms_norm


def autograd_module(layer: str, scale_last_grad: float = 1.0, ignore_documents: bool = False) -> types.ModuleType:
    """A stand-in for a kernel module: host functions computed by autograd through the PyTorch layer in float32,
    the last gradient scaled by `scale_last_grad`; ignore_documents: the conv drops seq_idx."""

    def grads(fn, args, dy):
        leaves = [a.detach().float().requires_grad_() for a in args]
        out = fn(*leaves)
        got = list(torch.autograd.grad(out, leaves, dy.float()))
        got[-1] = got[-1] * scale_last_grad
        return out.detach(), got

    if layer == "conv":

        def conv(x, w, b, seq_idx):
            return causal_conv1d_silu(x, w, b, None if ignore_documents else seq_idx)

        return types.SimpleNamespace(
            conv_fwd=lambda x, w, b, seq_idx: conv(x.float(), w, b, seq_idx),
            conv_bwd=lambda dy, x, w, b, seq_idx: tuple(grads(lambda *a: conv(*a, seq_idx), (x, w, b), dy)[1]),
        )
    eps, group = probe_layer.EPS, probe_layer.D_INNER

    def norm(x, z, w):
        return rms_norm(x, w, eps, z, group)

    return types.SimpleNamespace(
        norm_fwd=lambda x, w, e, z, g, dtype: (norm(x.float(), z.float(), w), None),
        norm_bwd=lambda dy, x, w, z, rstd, g: tuple(grads(norm, (x, z, w), dy)[1]),
    )


def test_max_error_tells_a_right_module_from_a_wrong_one():
    for layer in ("conv", "norm"):
        right = probe_layer.max_error(layer, autograd_module(layer), torch.float32, device="cpu")
        wrong = probe_layer.max_error(layer, autograd_module(layer, 1.01), torch.float32, device="cpu")
        assert right < 1e-5 and wrong > 5e-3, (layer, right, wrong)


def test_documents_check_tells_a_conv_that_ignores_them():
    right = probe_layer.max_error("conv", autograd_module("conv"), torch.float32, device="cpu", documents=True)
    blind = autograd_module("conv", ignore_documents=True)
    wrong = probe_layer.max_error("conv", blind, torch.float32, device="cpu", documents=True)
    assert right < 1e-5 and wrong > 5e-3, (right, wrong)
    ids = probe_layer.check_seq_idx(2, 133, "cpu")
    steps = ids.diff(dim=1)
    assert ids.dtype == torch.int32 and (ids[:, 0] == 0).all() and ((steps == 0) | (steps == 1)).all()
    assert (steps[0, [0, 3, 4]] == 1).all()  # one-token documents (tokens 0 and 4) end in a boundary


def test_documents_refused_for_the_norm(capsys):
    assert probe_layer.main(["norm", "--documents", "short"]) == 2
    assert "conv only" in capsys.readouterr().err


def test_variant_files_load_without_their_op_registrations(tmp_path):
    for layer, name in probe_layer.LAYERS.items():
        source = (probe_layer.Path(probe_layer.__file__).parents[1] / "kernels" / "cutile" / f"{name}.py").read_text()
        path = tmp_path / f"{name}_copy.py"
        path.write_text(source)
        module = probe_layer.load(layer, str(path))
        assert module.__name__ == f"probe_{name}_copy"
        assert not hasattr(module, "_backward") and callable(getattr(module, f"{layer}_fwd"))


def test_kernel_names_are_the_modules_tuning_names():
    """The probe pins each kernel's timed configuration for its float64 check by these names."""
    for layer, name in probe_layer.LAYERS.items():
        source = (probe_layer.Path(probe_layer.__file__).parents[1] / "kernels" / "cutile" / f"{name}.py").read_text()
        launched = set(re.findall(r'launch\(\s*"(\w+)"', source))
        assert launched == set(probe_layer.KERNELS[layer]), (layer, launched)
