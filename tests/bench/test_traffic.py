"""bench/traffic.py: each stage's memory floor, counted by hand on a tiny shape, and the stage and
constants read off cuTile kernel names."""

from __future__ import annotations

import pytest
from cuda.tile import compilation as ctc

from bench import aot
from bench.traffic import STAGES, SSDShape, Traffic, profiled, ssd_io, stage_traffic
from kernels.cutile import chunk_cumsum

# b 1, l 5, h 2, p 4, g 1, n 8, Q 4: c = 2 chunks, rows padded to c·Q = 8 tokens; x in float16, dt in bfloat16.
TINY = SSDShape(
    batch=1, seqlen=5, nheads=2, headdim=4, dstate=8, ngroups=1, chunk_size=4, dtype="float16", dt_dtype="bfloat16"
)
X = 1 * 5 * 2 * 4 * 2  # x, dy, y, dx: 40 float16 = 80 bytes
BC = 1 * 5 * 1 * 8 * 2  # B, C, dB, dC: 40 float16 = 80
ROW = 1 * 2 * 8 * 4  # dt_out, dA_cumsum, ddt_dir, da_intra, da_inter per block: (b, h, c·Q) float32 = 64
STATES = 1 * 2 * 2 * 4 * 8 * 4  # chunk_states, dstates: (b, c, h, p, n) float32 = 512
STATE = 1 * 2 * 4 * 8 * 4  # final_state, dinitial_states, initial_states, dfinal_state: (b, h, p, n) float32 = 256
VEC = 2 * 4  # A, D, dt_bias: (h,) float32 = 8
DT = 1 * 5 * 2 * 2  # dt: (b, l, h) bfloat16 = 20


def test_each_stage_moves_its_tensors_once_on_a_tiny_shape():
    by_hand = {
        "chunk_cumsum": Traffic(DT + VEC + VEC, 2 * ROW),  # dt, A, dt_bias -> dt_out, dA_cumsum
        "fwd_pass_state": Traffic(X + BC + 2 * ROW, STATES + STATE),  # x, B, dt_out, dA_cumsum -> states, final
        "compute_out": Traffic(X + 2 * BC + 2 * ROW + STATES + VEC, X),  # x, B, C, rows, chunk_states, D -> y
        "bwd_pass_state": Traffic(X + BC + ROW, STATES + STATE),  # dy, C, dA_cumsum -> dstates, dinitial_states
        # both walks: x, B, dt_out, dA_cumsum, dy, C -> chunk_states, final_state, dstates, dinitial_states
        "state_walks": Traffic(2 * X + 2 * BC + 2 * ROW, 2 * (STATES + STATE)),
        "bwd_dx": Traffic(2 * X + 2 * BC + 2 * ROW + STATES + VEC, X + 2 * ROW + 1 * 2 * 2 * 4),  # ... + dD_part
        "bwd_dbc": Traffic(2 * X + 2 * BC + 2 * ROW + 2 * STATES, 2 * BC + ROW),  # -> dB, dC, one da_inter block
        # ddt_dir, da_intra, da_inter, dt_out, A, dt_bias, dt, dD_part -> ddt, partial sums (3, h, b·c)
        "chunk_cumsum_bwd": Traffic(4 * ROW + 2 * VEC + DT + 1 * 2 * 2 * 4, DT + 3 * 1 * 2 * 2 * 4),
    }
    assert {stage: stage_traffic(stage, TINY) for stage in STAGES} == by_hand
    assert ssd_io(TINY) == Traffic(X + 2 * BC + DT + 3 * VEC, X)


def test_bf16_inputs_store_the_chunk_states_and_their_gradients_in_bf16():
    bf16 = SSDShape.of({**TINY.__dict__, "dtype": "bfloat16"})  # same element size as TINY's float16
    half = STATES // 2
    assert stage_traffic("fwd_pass_state", bf16) == Traffic(X + BC + 2 * ROW, half + STATE)
    assert stage_traffic("compute_out", bf16).read == X + 2 * BC + 2 * ROW + half + VEC
    assert stage_traffic("bwd_pass_state", bf16).write == half + STATE
    assert stage_traffic("bwd_dx", bf16).read == 2 * X + 2 * BC + 2 * ROW + half + VEC
    assert stage_traffic("bwd_dbc", bf16).read == 2 * X + 2 * BC + 2 * ROW + 2 * half


def test_constants_set_the_chunk_size_the_optional_inputs_and_the_dbc_blocks():
    # Q 2: 3 chunks, rows padded to 6 tokens (48 bytes), chunk_states of 3 chunks (768 bytes).
    assert stage_traffic("fwd_pass_state", TINY, {"Q": 2}) == Traffic(X + BC + 2 * 48, 768 + STATE)
    assert stage_traffic("fwd_pass_state", TINY, {"HAS_INIT": True}).read == X + BC + 2 * ROW + STATE
    assert stage_traffic("bwd_pass_state", TINY, {"HAS_DFINAL": True}).read == X + BC + ROW + STATE
    given = {"HAS_INIT": True, "HAS_DFINAL": True}
    assert stage_traffic("state_walks", TINY, given).read == 2 * X + 2 * BC + 2 * ROW + 2 * STATE
    assert stage_traffic("compute_out", TINY, {"HAS_D": False}).read == X + 2 * BC + 2 * ROW + STATES
    assert stage_traffic("chunk_cumsum", TINY, {"HAS_BIAS": False}).read == DT + VEC
    assert stage_traffic("chunk_cumsum", TINY, {"LOG2": True}).write == 3 * ROW  # the backward's: dA_cumsum·log2(e)
    no_d = {"HAS_D": False}
    assert stage_traffic("chunk_cumsum_bwd", TINY, {**no_d, "HAS_BIAS": False, "SOFTPLUS": False}).read == 4 * ROW + VEC
    assert stage_traffic("chunk_cumsum_bwd", TINY, {**no_d, "SOFTPLUS": False}).read == 4 * ROW + VEC  # no dt, bias
    assert stage_traffic("chunk_cumsum_bwd", TINY, {**no_d, "HAS_BIAS": False}).read == 4 * ROW + VEC + DT
    assert stage_traffic("chunk_cumsum_bwd", TINY, {"HAS_BIAS": False}).read == 4 * ROW + VEC + DT + 1 * 2 * 2 * 4
    assert stage_traffic("bwd_dbc", TINY, {"TILE_N": 4}).write == 2 * BC + 2 * ROW  # n 8 in two blocks of 4
    assert stage_traffic("bwd_dbc", TINY, {"TILE_N": 16}).write == 2 * BC + ROW  # a padded tile: one block


def test_bad_stage_and_dtype_are_named():
    with pytest.raises(ValueError, match="unknown stage 'bwd_x'"):
        stage_traffic("bwd_x", TINY)
    with pytest.raises(ValueError, match="unknown dtype 'bf16'"):
        stage_traffic("compute_out", SSDShape.of({**TINY.__dict__, "dtype": "bf16"}))


def test_profiled_reads_stage_and_constants_off_every_specialization_the_ssd_compiles():
    ssd = [(label, signature) for label, _, signature in aot.every_signature() if label.split("[")[0] in STAGES]
    assert {label.split("[")[0] for label, _ in ssd} == set(STAGES)
    for label, signature in ssd:
        stage = label.split("[")[0]
        found = profiled(ctc.mangle_kernel_name(f"{stage}_kernel", signature))
        consts = [p.value for p in signature.parameters if isinstance(p, ctc.ConstantConstraint)]
        assert found is not None and found.stage == stage, label
        assert list(found.constants.values()) == consts, label
        if "Q=" in label:
            assert found.constants["Q"] == int(label.split("Q=")[1].split(",")[0].rstrip("]")), label


def test_profiled_leaves_other_kernels_and_other_versions_alone():
    for name in ("_chunk_scan_fwd_kernel", "void at::native::reduce_kernel<512, 1>(int)", "sm90_xmma_gemm_K_x"):
        assert profiled(name) is None
    label, _, signature = next(chunk_cumsum.aot_signatures())
    stage = label.split("[")[0]
    fewer = ctc.KernelSignature(signature.parameters[:-1], signature.calling_convention)
    found = profiled(ctc.mangle_kernel_name(f"{stage}_kernel", fewer))  # a parameter less than the kernel here
    assert found is not None and found.stage == stage and found.constants is None
    other = ctc.mangle_kernel_name("matmul_kernel", signature)  # a cuTile kernel of no SSD stage
    assert profiled(other) is None


def test_profiled_reads_a_name_recorded_before_a_kernel_changed():
    # chunk_cumsum_kernel as results/kernels_h200_headline.json recorded it, before dA_log2 and LOG2 were added
    recorded = (
        "chunk_cumsum_kernel_Kt1_A3f32_2i16_3v4l0_4t1_p16_A1f32_1t1_p16_A1f32_1t1_p16_A3f32_3v4l0_4i16t1_p16"
        "_A3f32_3v4l0_4i16t1_p16_Si32_I64_I8_B1_B1"
    )
    found = profiled(recorded)
    assert found.stage == "chunk_cumsum"
    assert found.constants == {"Q": 64, "TILE_H": 8, "HAS_BIAS": True, "SOFTPLUS": True}
    # chunk_cumsum_bwd_kernel as the same series recorded it at commit af54e08, before dD_part and HAS_D were added
    recorded = (
        "chunk_cumsum_bwd_kernel_Kt1" + "_A3f32_3v4l0_4i16t1_p16" * 4 + "_A3f32_2i16_3v4l0_4t1_p16"
        "_A1f32_1t1_p16_A1f32_1t1_p16_A3f32_2i16_3v4l0_4t1_p16_A3f32_3v4l0_4i16t1_p16_Si32_I64_I16_B1_B1"
    )
    found = profiled(recorded)
    assert found.stage == "chunk_cumsum_bwd"
    assert found.constants == {"Q": 64, "TILE_H": 16, "HAS_BIAS": True, "SOFTPLUS": True}
    # fwd_pass_state_kernel as the series recorded it at commit 52ab913 (the L 2048 layer's recompute), before STEP
    recorded = (
        "fwd_pass_state_kernel_Kt2_A4bf16_7v8l0_8t1_ai16_p16_A4bf16_4s1_7v8l0_8t1_ai16_p16_A3f32_3v4l0_4i16t1_p16"
        "_A3f32_3v4l0_4i16t1_p16_A4f32_7v4l0_8t1_ci16_p16_A5bf16_fv8l0_10t1_1ai16_p16_A4f32_7v4l0_8t1_ci16_p16"
        "_I24_I24_I64_I32_I128_B0_B0_I4"
    )
    found = profiled(recorded)
    assert found.stage == "fwd_pass_state"
    constants = {"NHEADS": 24, "HEADS_PER_GROUP": 24, "Q": 64, "TILE_P": 32, "TILE_N": 128, "HAS_INIT": False}
    assert found.constants == {**constants, "TF32": False, "LATENCY": 4}
