"""GPU time per kernel: pooled over runs, names shortened, each cuTile stage against its memory floor."""

from __future__ import annotations

from tests.bench.report.synthetic import GPU, SHAPE, kernel_run, pooled, run_report, step_run, write


def fwd_pass_state_name(Q: int) -> str:
    """fwd_pass_state's kernel name as the profiler lists it, specialized for chunk size Q (CI's bf16 signature)."""
    from cuda.tile import compilation as ctc

    from bench.traffic import kernel_parameters
    from kernels.cutile import fwd_pass_state

    sig = next(
        s for label, _, s in fwd_pass_state.aot_signatures() if label.startswith("fwd_pass_state[bfloat16,Q=128")
    )
    params = list(sig.parameters)
    params[kernel_parameters("fwd_pass_state").index("Q")] = ctc.ConstantConstraint(Q)
    return ctc.mangle_kernel_name("fwd_pass_state_kernel", ctc.KernelSignature(params, sig.calling_convention))


def test_report_renders_gpu_time_per_kernel_and_the_memory_floor(tmp_path):
    """Each kernel's GPU time pooled over runs; fwd_pass_state at the forward's chunk 128 and the backward's 64 kept
    apart, each against its own floor (of all its launches in a call); names shortened; a record without
    per-kernel times left out."""
    q128, q64 = fwd_pass_state_name(128), fwd_pass_state_name(64)
    reduce = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::sum_functor<float> > >(X)"
    shape = {**SHAPE, "seqlen": 256}
    times = {128: [0.30, 0.32, 0.31], 64: [0.20, 0.22, 0.27]}  # ms per run
    copy = [1000.0, 2000.0, 3000.0]  # each run's copy ceiling, GB/s
    for i in range(3):
        top = {q128: times[128][i], q64: times[64][i], reduce: 0.05}
        cutile = {"shape": shape, "mode": "fwd_bwd", "backend": "cutile", "backward": "cutile", "gpu_ms": 1.0}
        cutile |= {"wall_ms": {"median": 2.0}, "kernels_per_call": 9, "top_kernels_ms": top}
        cutile |= {"kernel_launches": {q128: 1, q64: 2, reduce: 1}}  # Q 64 launched twice per call
        triton_top = {"_chunk_scan_fwd_kernel": 0.4} | ({"_chunk_state_bwd_db_kernel": 0.1} if i == 0 else {})
        triton = {"shape": shape, "mode": "fwd_bwd", "backend": "triton", "gpu_ms": 0.5, "wall_ms": {"median": 3.0}}
        triton |= {"kernels_per_call": 3 if i == 0 else 2, "top_kernels_ms": triton_top}
        if i == 0:  # every kind listed, one launched twice: nothing left over
            triton["kernel_launches"] = {"_chunk_scan_fwd_kernel": 2, "_chunk_state_bwd_db_kernel": 1}
        plain = {"shape": shape, "mode": "fwd_bwd", "backend": "cutile", "backward": "reference", "gpu_ms": 4.0}
        plain |= {"wall_ms": {"median": 5.0}}  # no top_kernels_ms
        run = {"kind": "bench_kernels", "environment": {"gpu": GPU}, "ceilings": {"copy_GBps": copy[i]}}
        run |= {"settings": {"out": "k"}, "records": [cutile, triton, plain]}
        write(tmp_path / f"kernels_k_run{i + 1}.json", run)
    write(tmp_path / "step_t.json", step_run())

    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_k", "--step", "step_t")
    assert done.returncode == 0, done.stderr
    section = (tmp_path / "BENCHMARKS.md").read_text().split("### GPU time per kernel")[1].split("## The training")[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line[:2] == "| "]
    rows = {tuple(c[:2]): c[2:] for c in cells}

    # The forward's Q 128 and the backward's Q 64: two rows, each with its own runs and its own floor.
    b, l, h, p, n = 3, 256, 5, 64, 128
    for Q, ms in times.items():
        moved = 2 * b * l * h * p + 2 * b * l * n + 2 * 4 * b * h * l  # x, B in bf16; dt_out, dA_cumsum in float32
        moved += 2 * b * (l // Q) * h * p * n + 4 * b * h * p * n  # chunk_states (bf16) and final_state written
        moved *= {128: 1, 64: 2}[Q]  # the floor of every launch in the call
        floor_us = [moved / (gbps * 1e3) for gbps in copy]
        of_floor = [f / (m * 1e3) for f, m in zip(floor_us, ms)]
        row = rows[("cutile + cutile backward", f"`fwd_pass_state` (Q {Q})")]
        assert row == [
            pooled(ms),
            f"{moved / 1e6:,.1f}",
            pooled(floor_us),
            pooled([100 * f for f in of_floor], "{:.0f}%"),
        ]
    # Other kernels: shortened, no floor; the call's time less the listed kernels' where it launched more.
    assert rows[("cutile + cutile backward", "`reduce_kernel (sum_functor)`")] == ["0.050 [0.050–0.050]", "", "", ""]
    rest = [1.0 - times[128][i] - times[64][i] - 0.05 for i in range(3)]
    assert rows[("cutile + cutile backward", "other kernels")][0] == pooled(rest)
    assert rows[("triton", "`_chunk_state_bwd_db_kernel` (in 1 of 3 runs)")][0] == "0.100"
    # Runs 2 and 3 list one of triton's two launches; run 1 lists all three (one kernel twice): no row there.
    assert rows[("triton", "other kernels (in 2 of 3 runs)")][0] == "0.100 [0.100–0.100]"
    assert ("triton", "other kernels") not in rows
    assert not any(k[0] == "cutile" for k in rows)  # the record without per-kernel times

    # No per-kernel times anywhere: said so, no table.
    walls = {"cutilereference": 0.5, "triton": 1.0, "cutilecutile": 0.3}
    for i in (1, 2, 3):
        write(tmp_path / f"kernels_k_run{i}.json", kernel_run(walls))
    done = run_report(tmp_path, tmp_path, "--kernels", "kernels_k", "--step", "step_t")
    assert done.returncode == 0, done.stderr
    assert "No per-kernel GPU times in the JSON (`top_kernels_ms`)." in (tmp_path / "BENCHMARKS.md").read_text()


def test_a_records_largest_kernels_show_and_the_rest_count_as_other():
    from bench.report.per_kernel import OTHER, SHOWN, per_kernel_figures

    top = {f"k{i}": 0.01 * (i + 1) for i in range(SHOWN + 3)}  # k0 smallest
    rec = {"top_kernels_ms": top, "kernels_per_call": len(top) + 2, "gpu_kernel_sum_ms": sum(top.values()) + 0.5}
    figures = per_kernel_figures(rec, None, {})
    shown = {name for name, fig in figures if name != OTHER}
    assert shown == {f"k{i}" for i in range(3, SHOWN + 3)}
    assert abs(figures[(OTHER, "ms")] - (0.01 + 0.02 + 0.03 + 0.5)) < 1e-9
    del rec["kernels_per_call"]  # older records: the kernels left out still count as other
    assert abs(per_kernel_figures(rec, None, {})[(OTHER, "ms")] - (0.01 + 0.02 + 0.03 + 0.5)) < 1e-9


def test_json_keeps_cutile_stages_by_full_name_and_others_by_short_name_summed():
    from bench.kernel_names import by_listed_name, short_name

    q128 = fwd_pass_state_name(128)
    sums = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::sum_functor<float> > >(X)"
    sums4 = "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::sum_functor<float> > >(X)"
    ms, launches = by_listed_name({q128: 0.25, sums: 0.5, sums4: 0.125}, {q128: 2, sums: 1})
    assert list(ms.items()) == [("reduce_kernel (sum_functor)", 0.625), (q128, 0.25)]
    assert launches == {"reduce_kernel (sum_functor)": 2, q128: 2}  # a kernel absent from launches: once
    assert short_name("reduce_kernel (sum_functor)") == "reduce_kernel (sum_functor)"  # a listed name shows as is
    assert short_name(q128) == "fwd_pass_state" and short_name("Memset (Device)") == "Memset (Device)"


def test_each_kind_of_a_steps_kernels_is_told_by_its_name():
    """kind_of sorts a profiled step's kernels, by full or short name: both SSDs' kernels, the cuTile layers, cuBLAS's
    matmuls and their split-K reductions, Inductor's kernels, the fused AdamW, and the rest."""
    from bench.kernel_names import KINDS, kind_of

    kinds = {
        "state_walks": "SSD",
        "chunk_cumsum_bwd": "SSD",
        "_chunk_scan_chunk_state_bwd_dx_kernel": "SSD",
        "_state_passing_fwd_kernel": "SSD",
        "_bmm_chunk_fwd_kernel": "SSD",
        "conv_bwd_gv": "conv + norm",
        "norm_fwd_kernel_Kt1_A2bf16_I4": "conv + norm",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "matmuls",
        "splitKreduce_kernel": "matmuls",
        "Kernel2 (cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align1)": "matmuls",
        "triton_per_fused__to_copy_add_div_expand_mul_pow_sum_view_6": "compiled by Inductor",
        "multi_tensor_apply_kernel (FusedAdamMathFunctor)": "optimizer",
        "reduce_kernel (sum_functor)": "other",
        "other kernels": "other",
    }
    assert {name: kind_of(name) for name in kinds} == kinds
    assert set(kinds.values()) == set(KINDS)
