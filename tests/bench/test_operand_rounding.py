"""bench/operand_rounding.py: the error that low-precision state operands add to the stages' outputs."""

from __future__ import annotations

import re

import torch

from tests.gpu_common import TOL
from tests.helpers import run_script


def figures(line: str) -> dict[str, tuple[float, float]]:
    found = re.findall(r"(\w+) ([\d.e+-]+) \(stored alone ([\d.e+-]+)\)", line)
    return {name: (float(err), float(alone)) for name, err, alone in found}


def test_rounded_states_move_the_outputs_within_the_tests_tolerance():
    done = run_script("-m", "bench.operand_rounding", "--sizes", "32", timeout=300)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.strip().splitlines())
    bf16, fp16 = figures(lines["bfloat16"]), figures(lines["float16"])
    assert set(bf16) == {"y", "dx", "ddt_dir", "da_intra", "dD", "dB", "dC", "da_inter"} == set(fp16)
    for name in ("y", "dB", "dC", "da_inter", "da_intra", "ddt_dir"):  # every output a rounded operand reaches
        assert 0 < bf16[name][0] < TOL[torch.bfloat16] and 0 < fp16[name][0] < TOL[torch.float16]
        assert fp16[name][0] < bf16[name][0]  # fp16 keeps 3 more mantissa bits
    assert bf16["dD"][0] == 0.0  # dD reads no state
    assert bf16["dB"][1] > 0 and bf16["da_inter"][1] == 0.0  # stored outputs round, float32 ones do not


def test_an_unknown_dtype_is_one_line():
    done = run_script("-m", "bench.operand_rounding", "--dtypes", "bfloat17")
    assert done.returncode == 2 and done.stderr.strip() == "operand_rounding.py: error: unknown dtype 'bfloat17'"
