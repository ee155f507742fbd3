"""Every cuTile kernel compiles to a cubin with no GPU present, with the hints its launches give: each kernel's default
specialization for Hopper in the default run, every specialization for Hopper and Blackwell in the slow tier."""

from __future__ import annotations

import importlib
import io
import os
import pkgutil
import re

import cuda.tile as ct
import pytest
import torch
from cuda.tile import compilation as ctc

from bench import aot
from kernels import cutile

ARCHS = ("sm_90", "sm_100")


def defined_kernels() -> dict[str, set[str]]:
    """Module name -> the names of the cuTile kernels it defines (not those it imports), for every module of
    kernels/cutile that defines one."""
    found = {}
    for info in pkgutil.iter_modules(cutile.__path__):
        module = importlib.import_module(f"kernels.cutile.{info.name}")
        names = {
            name
            for name, value in vars(module).items()
            if isinstance(value, ct.kernel) and value._pyfunc.__module__ == module.__name__
        }
        if names:
            found[module.__name__] = names
    return found


def test_every_kernel_declares_its_specializations():
    """Each module defining a kernel declares its specializations, each of its kernels has at least one, labelled by
    its stage (the kernel's name without _kernel), and no label repeats: so no kernel leaves what CI compiles."""
    kernels = defined_kernels()
    sources = {module.__name__: module.aot_signatures for module in aot.kernel_modules()}
    assert set(kernels) <= set(sources), set(kernels) - set(sources)
    labels = []
    for module, names in kernels.items():
        compiled = set()
        for label, kernel, _ in sources[module]():
            name = kernel._pyfunc.__name__
            assert name in names and label.startswith(name.removesuffix("_kernel") + "["), (module, label)
            compiled.add(name)
            labels.append(label)
        assert compiled == names, (module, names - compiled)
    assert len(labels) == len(set(labels)) == len(list(aot.every_signature()))
    stages = {name.removesuffix("_kernel") for names in kernels.values() for name in names}
    firsts = [label.split("[")[0] for label in aot.first_of_each_kernel()]
    assert sorted(firsts) == sorted(stages)  # the default run compiles one specialization of every kernel


def test_ci_builds_each_kernel_with_its_default_hints():
    """A launch compiles the kernel with its configuration's occupancy hint; CI builds each default's, and each
    kernel's first specialization (the one the default run compiles) is its default at bf16 with that hint, but
    bwd_dx's: float32's default."""
    from kernels.cutile import (
        bwd_dx,
        causal_conv,
        chunk_cumsum_bwd,
        compute_out,
        fwd_pass_state,
        rms_norm,
        state_walks,
    )

    bf16 = torch.bfloat16
    defaults = {
        "fwd_pass_state": fwd_pass_state.default_state_config(bf16, 64, 128, 128, fwd_pass_state.MANY_PAIRS).occupancy,
        "compute_out": compute_out.default_out_config(bf16).occupancy,
        "bwd_pass_state": fwd_pass_state.StateConfig().occupancy,
        "state_walks": state_walks.default_walks_config(bf16, fwd_pass_state.MANY_PAIRS, 64, 128).occupancy,
        "bwd_dx": bwd_dx.default_dx_config(bf16).occupancy,
        "chunk_cumsum_bwd": chunk_cumsum_bwd.CumsumBwdConfig().occupancy,
        "conv_fwd": causal_conv.DEFAULT_FWD.occupancy,
        "conv_bwd_gv": causal_conv.DEFAULT_BWD.occupancy,
        "norm_fwd": rms_norm.DEFAULT_FWD.occupancy,
        "norm_bwd": rms_norm.DEFAULT_BWD.occupancy,
    }
    labels = [label for label, _, _ in aot.every_signature()]
    firsts = {label.split("[")[0]: label for label in aot.first_of_each_kernel()}
    for name, occupancy in defaults.items():
        assert occupancy > 1, name  # tuned defaults all take a hint; a 1 would leave nothing to check here
        assert any(lab.startswith(f"{name}[bfloat16") and f"occupancy={occupancy}]" in lab for lab in labels), name
        if name != "bwd_dx":
            assert firsts[name].startswith(f"{name}[bfloat16") and firsts[name].endswith(f"occupancy={occupancy}]"), (
                name
            )
    # bwd_dx's first is float32's default (one chunk a program, no hint): the bf16 build compiles in the slow tier
    assert bwd_dx.default_dx_config(torch.float32).occupancy == 1 and firsts["bwd_dx"].startswith("bwd_dx[float32")
    assert all(label.startswith(f"{name}[bfloat16") for name, label in firsts.items() if name != "bwd_dx")


def test_every_specialization_lowers_to_tile_ir():
    """cuTile's front end type-checks each specialization, its branches on constants taken or dropped: every one
    lowers to Tile IR bytecode (fast; tileiras, the slow part, compiles each kernel's first in the default run)."""
    for label, kernel, signature in aot.every_signature():
        try:
            ctc.export_kernel(kernel, [signature], io.BytesIO(), output_format="tileir_bytecode")
        except Exception as e:
            pytest.fail(f"{label} does not lower to Tile IR: {e}")


def test_each_kernel_compiles_its_default_for_hopper():
    firsts = aot.first_of_each_kernel()
    sizes = aot.export(["sm_90"], firsts, workers=os.cpu_count() or 1)
    assert list(sizes["sm_90"]) == firsts
    assert all(size > 1000 for size in sizes["sm_90"].values())


@pytest.mark.slow
def test_every_specialization_compiles_to_a_cubin():
    sizes = aot.export(ARCHS, workers=os.cpu_count() or 1)
    labels = [label for label, _, _ in aot.every_signature()]
    assert all(list(sizes[arch]) == labels for arch in ARCHS)
    assert all(size > 1000 for arch in ARCHS for size in sizes[arch].values())


def test_a_failed_compile_names_the_specialization_and_the_architecture():
    label = aot.first_of_each_kernel()[0]
    with pytest.raises(RuntimeError, match=rf"failed to compile: {re.escape(label)} for sm_1\. First: \w+"):
        aot.export(["sm_1"], [label])
    with pytest.raises(ValueError, match=r"no specialization labelled nope\[\]"):
        aot.export(ARCHS, ["nope[]"])


def test_the_export_tool_refuses_a_bad_architecture_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        aot.main(["sm_9x"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == "python -m bench.aot: error: architectures are named like sm_90, got sm_9x"
    )
