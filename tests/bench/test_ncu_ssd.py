"""bench/ncu_ssd.py's summary of an exported ncu raw page (the profiling itself needs a GPU and ncu)."""

from __future__ import annotations

import csv

from cuda.tile import compilation as ctc

from bench.ncu_ssd import main, source_summary, summarize, trim
from kernels.cutile import bwd_dx

STALLS = ("long_scoreboard", "barrier", "math_pipe_throttle", "wait", "selected")
HEADER = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"]
HEADER += ["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread"]
HEADER += [f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS]
UNITS = ["", "", "ns", "byte", "byte", "%", "register/thread"] + [""] * len(STALLS)
# a cuTile kernel's name as a profile shows it (mangled with its specialization)
CUTILE = ctc.mangle_kernel_name("bwd_dx_kernel", next(bwd_dx.aot_signatures())[2])
TORCH = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::ReduceOp<float>)"


def write(path, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([HEADER, UNITS, *rows])


def test_the_table_scales_units_and_ranks_the_stalls(tmp_path, capsys):
    path = tmp_path / "seed.csv"
    write(
        path,
        [
            ["1", CUTILE, "207,000", "150000000", "33500000", "44.5", "80", "5.5", "0.5", "1.25", "2.0", "9.0"],
            ["2", TORCH, "6100", "1000000", "n/a", "3.0", "32", "0.1", "0.0", "0.0", "0.3", "1.0"],
        ],
    )
    lines = summarize(path).splitlines()
    assert len(lines) == 3 and lines[0].startswith("kernel") and "top stalls" in lines[0]
    # names as BENCHMARKS.md shows them (bench/report.py): a cuTile kernel's stage, another kernel's function
    assert lines[1][:48].strip() == "bwd_dx" and lines[2][:48].strip() == "reduce_kernel"
    first = lines[1][48:].split()
    assert first[:3] == ["207.0", "150.0", "33.5"]  # us, MB read, MB written
    assert lines[1].endswith("long_scoreboard 5.5, wait 2.0, math_pipe_throttle 1.2")  # "selected" is no wait
    second = lines[2][48:].split()
    assert second[0] == "6.1" and second[2] == "-"  # n/a -> "-"
    assert "L2 %" in lines[0] and first[5] == "-"  # a metric the CSV lacks
    assert main(["--summary", str(path)]) == 0 and capsys.readouterr().out.splitlines()[1] == lines[1]


def test_trim_keeps_what_the_table_reads(tmp_path):
    extra = ["device__attribute_x", "smsp__pcsamp_sample_count"]
    full = [HEADER + extra, UNITS + ["", ""], ["1", CUTILE, "5", "1", "1", "1", "1", "1", "1", "1", "1", "1", "7", "8"]]
    text = "\n".join(",".join(f'"{v}"' for v in row) for row in full)
    trimmed = trim(text)
    assert trimmed.splitlines()[0].split(",") == HEADER  # the two unread columns are gone, the order kept
    path = tmp_path / "t.csv"
    path.write_text(trimmed)
    assert summarize(path).splitlines()[1][48:].split()[0] == "0.0"  # 5 ns


def test_an_empty_export_says_so(tmp_path):
    path = tmp_path / "none.csv"
    path.write_text("")
    assert "no kernels profiled" in summarize(path)


def test_the_source_summary_ranks_instructions_and_opcodes(tmp_path, capsys):
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)"]
    rows = [
        ["0x10", "HGMMA.64x32x16.F32.BF16 R24, R72, gdesc[UR4], R24", "30", "30"],
        ["0x20", "@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8+0x18810], R4", "50", "49"],
        ["0x30", "HGMMA.64x32x16.F32.BF16 R24, R76, gdesc[UR4], R24", "10", "10"],
        ["0x40", "MOV R1, c[0x0][0x28]", "10", "2"],
    ]
    text = "\n".join(",".join(f'"{v}"' for v in r) for r in [["compute_out_kernel"], header, *rows])
    lines = source_summary(text).splitlines()
    assert lines[0] == "compute_out_kernel" and lines[1] == "4 instructions, 100 samples; the 25 with most:"
    assert lines[2].split()[:2] == ["50.0%", "@!P0"] and lines[3].split()[0] == "30.0%"
    # the predicate is not the opcode; the two HGMMAs sum
    assert lines[-1] == "  by opcode: SYNCS.PHASECHK.TRANS64.TRYWAIT 50.0%, HGMMA.64x32x16.F32.BF16 40.0%, MOV 10.0%"
    assert source_summary("==ERR== no,table\n").splitlines() == [
        "no source table with warp-state samples found:",
        "==ERR== no,table",
    ]
    path = tmp_path / "s.csv"
    path.write_text(text)
    assert main(["--source-summary", str(path)]) == 0 and capsys.readouterr().out.splitlines()[0] == lines[0]
