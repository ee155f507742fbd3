"""The cuTile conv and norm name what they cannot take, in one line."""

from __future__ import annotations

import pytest
import torch


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
