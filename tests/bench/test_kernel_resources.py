"""bench/kernel_resources.py --launched, on the CPU: a kernel name as a GPU profile shows it gives back that
launch's specialization, from the production module or from a changed copy; and one launched specialization's build
read with cuobjdump (requirements-dev.txt's nvidia-cuda-cuobjdump)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cuda.tile import compilation as ctc

from bench import kernel_resources
from kernels.cutile import causal_conv, fwd_pass_state

# conv_bwd_gv_kernel in the specialization the medium model's compiled step launched the conv's one-pass backward
# kernel in (results/step_h200_layers_quick.json's profile; the gv kernel took over its parameters), with the runtime
# `steps` (an int32) the gv kernel took later: the kernel as it was while its dbias partials had an array of their own
# (the name's A3f32 after A4f32); LAUNCHED is the same launch with them in the dweight partials' fifth row
LAUNCHED_BEFORE_BIAS_ROW = (
    "conv_bwd_gv_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2f32_1i16v4l0_2t1_p16_A1f32_1i16t1_p16_A3bf16_3v8l0_4t1_6i16_p16"
    "_A3bf16_3v8l0_4t1_6i16_p16_A4f32_6i16_7v4l0_8t1_p16_A3f32_3v4l0_4t1_6i16_p16_Si32_I4_I16_I256_B1"
)
LAUNCHED_ONE_DY = LAUNCHED_BEFORE_BIAS_ROW.replace("_A3f32_3v4l0_4t1_6i16_p16_Si32", "_Si32")
# LAUNCHED: the same launch with the kernel's parameters since it takes up to three channel parts' dy (dy1 and dy2
# as dy0, here dy's encoding) and their column-block bounds end0, end1 (two more int32 scalars after `steps`)
_DY = "_A3bf16_3v8l0_4t1_6i16_p16"
# without document boundaries the weight stands in for seq_idx (after bias) and HAS_SEQ_IDX is False (last)
_BIAS, _WEIGHT = "_A1f32_1i16t1_p16", "_A2f32_1i16v4l0_2t1_p16"
LAUNCHED = (
    LAUNCHED_ONE_DY.replace(_DY * 2, _DY * 4).replace("_Si32", "_Si32_Si32_Si32").replace(_BIAS, _BIAS + _WEIGHT, 1)
    + "_B0"
)
# conv_fwd_kernel as the medium model's step launched it (results/probes/step_three_patches_2026-12-02/profile.json)
# while it stored one part's y; LAUNCHED_FWD: the same launch with the kernel's parameters since it stores up to
# three channel parts' outputs (y1 and y2 as y0, here y's encoding) at their column-block bounds end0, end1
LAUNCHED_FWD_ONE_Y = (
    "conv_fwd_kernel_Kt1_A3bf16_3v8l0_4t1_6i16_p16_A2f32_1i16v4l0_2t1_p16_A1f32_1i16t1_p16_A3bf16_3v8l0_4t1_6i16_p16"
    "_I4_I16_I256_B1"
)
LAUNCHED_FWD = LAUNCHED_FWD_ONE_Y.replace(_DY + "_I4", _DY * 3 + "_Si32_Si32_I4").replace(_BIAS, _BIAS + _WEIGHT, 1)
LAUNCHED_FWD += "_B0"


def test_a_launched_name_gives_its_kernel_and_signature():
    label, kernel, signature = kernel_resources.launched(LAUNCHED, None)
    assert label == "conv_bwd_gv_kernel[4, 16, 256, True, False]"
    assert kernel is causal_conv.conv_bwd_gv_kernel
    x = signature.parameters[0]
    assert isinstance(x, ctc.ArrayConstraint) and x.stride_divisible_by == (8, 8, 1) and x.base_addr_divisible_by == 16


def test_a_launched_forward_name_gives_its_kernel_and_signature():
    label, kernel, signature = kernel_resources.launched(LAUNCHED_FWD, None)
    assert label == "conv_fwd_kernel[4, 16, 256, True, False]"
    assert kernel is causal_conv.conv_fwd_kernel
    assert len(signature.parameters) == 14


def test_a_launched_name_from_a_changed_copy(tmp_path):
    copy = tmp_path / "causal_conv_copy.py"
    copy.write_text(Path(causal_conv.__file__).read_text() + "\nMARK = 1\n")
    _, kernel, _ = kernel_resources.launched(LAUNCHED, str(copy))
    assert kernel is not causal_conv.conv_bwd_gv_kernel
    copied = sys.modules["probe_causal_conv_copy"]  # bench.variants's name for the copy
    assert copied.conv_bwd_gv_kernel is kernel and copied.MARK == 1


def test_a_name_from_other_code_is_one_clear_error():
    with pytest.raises(SystemExit, match=r"encodes 12 parameters, conv_bwd_gv_kernel in .* takes 17: a name launched"):
        kernel_resources.launched(LAUNCHED_BEFORE_BIAS_ROW, None)
    with pytest.raises(SystemExit, match=r"encodes 11 parameters, conv_bwd_gv_kernel in .* takes 17: a name launched"):
        kernel_resources.launched(LAUNCHED_ONE_DY, None)
    with pytest.raises(SystemExit, match=r"encodes 8 parameters, conv_fwd_kernel in .* takes 14: a name launched"):
        kernel_resources.launched(LAUNCHED_FWD_ONE_Y, None)


def test_an_unknown_kernel_is_one_clear_error():
    with pytest.raises(SystemExit, match="no kernel nope_kernel in kernels/cutile"):
        kernel_resources.launched("nope_kernel_Kt1_I4", None)


def test_sass_counts_memory_special_function_and_warpgroup_instructions_with_modifiers():
    sass = """
        /*0100*/                   WARPGROUP.ARRIVE ;
        /*0110*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0120*/                   LDG.E.128 R4, desc[UR6][R2.64] ;
        /*0130*/                   LDG.E.128 R8, desc[UR6][R2.64+0x10] ;
        /*0140*/                   MUFU.EX2 R5, R5 ;
        /*0150*/                   FFMA R5, R5, R6, R7 ;
        /*0160*/                   STG.E.U16 desc[UR6][R10.64], R5 ;
        /*0170*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0180*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
    """
    found = kernel_resources.SASS_OPS.findall(sass)
    assert sorted(found) == [
        "HGMMA.64x32x16.F32.BF16",
        "LDG.E.128",
        "LDG.E.128",
        "MUFU.EX2",
        "STG.E.U16",
        "UTMALDG.2D",
        "WARPGROUP.ARRIVE",
        "WARPGROUP.DEPBAR.LE",
    ]


def test_threads_per_program_come_from_the_elf_reqntid():
    elf = """
        <0x5f>
        Attribute:\tEIATTR_REQNTID
        Format:\tEIFMT_SVAL
        Value:\t0x100 0x1 0x1
        <0x60>
    """
    assert kernel_resources.threads(elf) == 256
    assert kernel_resources.threads(elf.replace("0x1 0x1", "0x2 0x1")) == 512
    assert kernel_resources.threads("Attribute:\tEIATTR_CRS_STACK_SIZE") is None


# fwd_pass_state_kernel as the kernels headline's L 2048 layer launched it for the cuTile backward's recompute
# (results/kernels_h200_headline.json: chunk 64, a 32 x 128 tile, one chunk an iteration), which tuning runs at
# occupancy 4
LAUNCHED_RECOMPUTE = (
    "fwd_pass_state_kernel_Kt2_A4bf16_7v8l0_8t1_ai16_p16_A4bf16_4s1_7v8l0_8t1_ai16_p16_A3f32_3v4l0_4i16t1_p16"
    "_A3f32_3v4l0_4i16t1_p16_A4f32_7v4l0_8t1_ci16_p16_A5bf16_fv8l0_10t1_1ai16_p16_A4f32_7v4l0_8t1_ci16_p16"
    "_I24_I24_I64_I32_I128_B0_B0_I4_I1_A3f32_3v4l0_4i16t1_p16_B0"  # dt_out's rows standing in for seq_idx, no HAS_SEQ_IDX
)


def test_a_one_chunk_walk_keeps_its_state_in_registers():
    """A walk taking one chunk an iteration stores the state entering the chunk before stepping over it: held
    across the step instead, it spilled at occupancy 4 and the L 2048 recompute was slower (docs/kernels.md,
    fwd_pass_state)."""
    label, kernel, signature = kernel_resources.launched(LAUNCHED_RECOMPUTE, None)
    assert kernel is fwd_pass_state.fwd_pass_state_kernel and label.endswith("32, 128, False, False, 4, 1, False]")
    cuobjdump = kernel_resources.wheel_cuobjdump()
    assert cuobjdump, "cuobjdump not found: pip install -r requirements-dev.txt (nvidia-cuda-cuobjdump)"
    built = kernel_resources.resources(kernel.replace_hints(occupancy=4), signature, "sm_90", cuobjdump)
    assert "STACK:0 " in built and "LOCAL:0 " in built, built
