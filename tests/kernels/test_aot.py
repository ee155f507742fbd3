"""Every cuTile kernel compiles to a cubin for Hopper and Blackwell with no GPU present, with the hints its launches give."""

from __future__ import annotations

import pytest
import torch

from bench import aot


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
