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
    with pytest.raises(ValueError, match=r"seq_idx must be int32 \(1, 8\), got torch.int64 \(1, 8\)"):
        causal_conv1d_silu(x, w, b, [4], seq_idx=torch.zeros(1, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"seq_idx must be int32 \(1, 8\), got torch.int32 \(8,\)"):
        causal_conv1d_silu(x, w, b, [4], seq_idx=torch.zeros(8, dtype=torch.int32))


def test_cutile_conv_tunes_launches_with_document_ids_under_their_own_keys():
    """Keys without ids are as the shipped table's (tuned.json); with ids each kernel's key is another."""
    import json

    from kernels.cutile import tuning
    from kernels.cutile.causal_conv import _key, _parts_key

    x = torch.empty(8, 2048, 1792, dtype=torch.bfloat16, device="meta")
    seq_idx = torch.empty(8, 2048, dtype=torch.int32, device="meta")
    sizes = [1536, 128, 128]
    shipped = {key.split("|")[0] + "|" + key.split("|")[1] for key in json.loads(tuning.SHIPPED.read_text())}
    plain = {f"conv_fwd|{_parts_key(x, 4, sizes, None)}", f"conv_bwd|{_parts_key(x, 4, sizes, None)}"}
    plain.add(f"conv_bwd_dx|{_key(x, 4, None)}")
    assert plain <= shipped
    with_ids = {_parts_key(x, 4, sizes, seq_idx), _parts_key(x, 4, [1792], seq_idx), _key(x, 4, seq_idx)}
    assert with_ids == {"b8_l2048_c1792_k4_bfloat16_seq_idx_parts1536-128-128", "b8_l2048_c1792_k4_bfloat16_seq_idx"}


def test_cutile_conv_compiles_each_specialization_with_document_ids_too():
    """Every conv specialization has a twin with ids: the same label with `,seq_idx`, its HAS_SEQ_IDX (the last
    constant) on, and an int32 (b, l) array in the seq_idx slot where the plain one has the fp32 weight again."""
    import cuda.tile as ct

    from kernels.cutile.causal_conv import aot_signatures

    specs = {label: signature.parameters for label, _, signature in aot_signatures()}
    plain = [label for label in specs if ",seq_idx" not in label]
    twins = {label.replace(",seq_idx", ""): label for label in specs if ",seq_idx" in label}
    assert len(plain) > 40 and sorted(twins) == sorted(plain)
    for label, twin in twins.items():
        slot = 2 if label.startswith("conv_bwd_dx") else 3  # after (gv, weight) or (x, weight, bias)
        assert specs[label][-1].value is False and specs[twin][-1].value is True, label
        assert specs[label][slot].dtype == ct.float32 and specs[twin][slot].dtype == ct.int32, label
        assert specs[twin][slot].ndim == 2 and specs[twin][:slot] == specs[label][:slot], label


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
