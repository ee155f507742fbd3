"""The names profiled GPU kernels are shown by, in BENCHMARKS.md (bench/report/per_kernel.py) and in Nsight
Compute's per-kernel table (bench/ncu_ssd.py). Importing this loads nothing heavy: bench.traffic (torch) is imported
on first use."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.traffic import Profiled

FUNCTOR = re.compile(r"\b\w*(?:Functor|functor)\w*|\b\w+_kernel(?:_cuda)?\b")  # what a C++ kernel was built with


@functools.cache
def cutile_kernel(name: str) -> Profiled | None:
    """The cuTile SSD stage and constants of a profiled kernel's name (bench.traffic.profiled), or None."""
    from bench.traffic import profiled

    return profiled(name)


def short_name(name: str) -> str:
    """A profiled kernel's name as shown: a cuTile stage's name; another kernel's function name (with its namespace
    where the name alone is `kernel`) and the functor or first named template argument it was instantiated with."""
    found = cutile_kernel(name)
    if found:
        return found.stage
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
