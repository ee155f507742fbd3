"""The names profiled GPU kernels are shown by, in BENCHMARKS.md (bench/report/per_kernel.py) and in Nsight
Compute's per-kernel table (bench/ncu_ssd.py). Importing this loads nothing heavy: bench.traffic (torch) is imported
on first use."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.traffic import Profiled

CUTILE_MANGLED = re.compile(r"(\w+?)_kernel_Kt\d+_")  # a cuTile kernel: NAME_kernel_Kt<its specialization>
SHORT = re.compile(r"[\w:]+(?: \(\w+\))?")  # a name as short_name gives it: "function" or "function (detail)"
FUNCTOR = re.compile(r"\b\w*(?:Functor|functor)\w*|\b\w+_kernel(?:_cuda)?\b")  # what a C++ kernel was built with
# What a training step's kernels do, for its GPU time by kind (kind_of)
KINDS = ("matmuls", "SSD", "conv + norm", "compiled by Inductor", "optimizer", "other")
MATMUL = re.compile(r"gemm|nvjet|splitKreduce|xmma|cutlass|magma", re.IGNORECASE)  # cuBLAS's, CUTLASS's, MAGMA's
TRITON_SSD = re.compile(r"_(?:chunk|state_passing|bmm_chunk)\w*_kernel$")  # mamba_ssm's SSD kernels


@functools.cache
def cutile_kernel(name: str) -> Profiled | None:
    """The cuTile SSD stage and constants of a profiled kernel's name (bench.traffic.profiled), or None."""
    from bench.traffic import profiled

    return profiled(name)


def short_name(name: str) -> str:
    """A profiled kernel's name as shown: a cuTile SSD stage's name; another cuTile kernel's name without `_kernel` and
    its specialization ("conv_fwd"); another kernel's function name (with its namespace
    where the name alone is `kernel`) and the functor or first named template argument it was instantiated with."""
    found = cutile_kernel(name)
    if found:
        return found.stage
    if mangled := CUTILE_MANGLED.match(name):  # a cuTile kernel other than the SSD's stages (conv, norm)
        return mangled[1]
    if SHORT.fullmatch(name):  # already short (a JSON keeps kernels by listed_name)
        return name
    depth, outside = 0, []
    for ch in name:  # the name without its template arguments and parameter lists
        depth += (ch in "<(") - (ch in ">)")
        outside += [ch] if depth == 0 and ch not in ">)" else []
    parts = ("".join(outside).split() or [name])[-1].split("::")
    function = "::".join(parts[-2:]) if parts[-1] == "kernel" else parts[-1]
    functors = [f for f in FUNCTOR.findall(name) if f != parts[-1]]
    first = re.match(r"[^<(]*<\s*([A-Za-z]\w*_\w+)", name)  # the first template argument, when it is a name
    detail = functors[-1] if functors else first[1] if first else None
    return f"{function} ({detail})" if detail else function


def listed_name(name: str) -> str:
    """The name a benchmark JSON keeps for a profiled kernel: a cuTile SSD stage's full name (bench.report.per_kernel
    reads its constants back from it), any other kernel's short_name."""
    return name if cutile_kernel(name) else short_name(name)


def by_listed_name(
    ms: dict[str, float], launches: dict[str, float], name_of: Callable[[str], str] = listed_name
) -> tuple[dict[str, float], dict[str, float]]:
    """Kernels' ms and launches per call (bench.timing.gpu_kernel_ms's by_kernel and launches) keyed by name_of
    (default listed_name; bench_step's profile: short_name), kernels that share one summed; ms largest first."""
    summed: dict[str, float] = {}
    count: dict[str, float] = {}
    for name, t in ms.items():
        shown = name_of(name)
        summed[shown] = summed.get(shown, 0.0) + t
        count[shown] = count.get(shown, 0.0) + launches.get(name, 1)
    return dict(sorted(summed.items(), key=lambda kv: -kv[1])), count


def kind_of(name: str) -> str:
    """Which of KINDS a profiled kernel is, by its short_name: "SSD" for a cuTile SSD stage or mamba_ssm's Triton SSD
    kernels, "conv + norm" for the cuTile conv and gated RMSNorm, "matmuls" for cuBLAS's and CUTLASS's (split-K
    reductions included), "compiled by Inductor" for torch.compile's Triton kernels, "optimizer" for the fused
    AdamW, "other" for the rest (PyTorch's own elementwise and reduction kernels)."""
    from bench.traffic import STAGES

    shown = short_name(name)
    if shown in STAGES or TRITON_SSD.match(shown):
        return "SSD"
    if shown.startswith(("conv_", "norm_")):
        return "conv + norm"
    if MATMUL.search(shown):
        return "matmuls"
    if shown.startswith("triton_"):
        return "compiled by Inductor"
    if shown.startswith("multi_tensor_apply"):
        return "optimizer"
    return "other"
