"""Ahead-of-time compilation of every cuTile kernel (the SSD's, the causal conv's and the gated RMSNorm's, forward and
backward) to cubins, with no GPU present.

Each kernel module of kernels/cutile declares the specializations its launches compile in `aot_signatures()`
(kernels.cutile.signature); this tool gathers them and compiles each for the GPU architectures named, in parallel
worker processes. CI compiles every specialization for sm_90 and sm_100, so a kernel that stops compiling for Hopper
or Blackwell fails CI.

    python -m bench.aot sm_90 sm_100
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib
import io
import multiprocessing
import os
import pkgutil
import re
import sys
import time
import types
from collections.abc import Iterator, Sequence

from cuda.tile import compilation as ctc

from kernels import cutile
from kernels.cutile.signature import Specialization


def kernel_modules() -> list[types.ModuleType]:
    """The modules of kernels/cutile that declare `aot_signatures()`, in name order."""
    names = sorted(m.name for m in pkgutil.iter_modules(cutile.__path__))
    modules = [importlib.import_module(f"kernels.cutile.{name}") for name in names]
    return [m for m in modules if hasattr(m, "aot_signatures")]


def every_signature() -> Iterator[Specialization]:
    """Every specialization CI compiles, module by module: (label, kernel with its launch's hints, signature)."""
    for module in kernel_modules():
        yield from module.aot_signatures()


def first_of_each_kernel() -> list[str]:
    """The label of each kernel's first specialization, one a kernel: its default configuration, which the default
    test run compiles (kernels.cutile.signature)."""
    firsts: dict[str, str] = {}
    for label, _, _ in every_signature():
        firsts.setdefault(label.split("[")[0], label)
    return list(firsts.values())


@functools.cache
def _by_label() -> dict[str, Specialization]:
    return {label: (label, kernel, sig) for label, kernel, sig in every_signature()}


def cubin_size(label: str, gpu_code: str) -> int | str:
    """The bytes of the cubin of specialization `label` for `gpu_code`, or the compiler's error as text."""
    _, kernel, sig = _by_label()[label]
    buf = io.BytesIO()
    try:
        ctc.export_kernel(kernel, [sig], buf, gpu_code=gpu_code, output_format="cubin")
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return len(buf.getvalue())


def export(
    gpu_codes: Sequence[str], labels: Sequence[str] | None = None, workers: int = 1
) -> dict[str, dict[str, int]]:
    """Compile the specializations named by `labels` (default: every one) for each of `gpu_codes` ("sm_90",
    "sm_100", ...) in `workers` processes (1: in this one): gpu_code -> label -> cubin bytes.

    Raises RuntimeError naming each specialization and architecture that failed to compile, and the first error.
    """
    labels = list(_by_label()) if labels is None else list(labels)
    unknown = [label for label in labels if label not in _by_label()]
    if unknown:
        raise ValueError(f"bench.aot: no specialization labelled {', '.join(unknown)}")
    jobs = [(label, arch) for arch in gpu_codes for label in labels]
    if workers <= 1:
        results = [cubin_size(label, arch) for label, arch in jobs]
    else:  # fresh interpreters: nothing of the caller's state (threads, CUDA) is forked
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            results = list(pool.map(cubin_size, *zip(*jobs)))
    failed = [(label, arch, err) for (label, arch), err in zip(jobs, results) if isinstance(err, str)]
    if failed:
        names = ", ".join(f"{label} for {arch}" for label, arch, _ in failed)
        raise RuntimeError(f"cuTile kernels failed to compile: {names}. First: {failed[0][2]}")
    sizes: dict[str, dict[str, int]] = {arch: {} for arch in gpu_codes}
    for (label, arch), size in zip(jobs, results):
        sizes[arch][label] = size
    return sizes


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.aot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("archs", nargs="*", default=["sm_90", "sm_100"], help="GPU architectures (default: sm_90 sm_100)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPU cores)")
    args = ap.parse_args(argv)
    bad = [a for a in args.archs if not re.fullmatch(r"sm_\d{2,3}a?", a)]
    if bad or args.jobs < 1:
        ap.error(f"architectures are named like sm_90, got {', '.join(bad)}" if bad else "--jobs must be at least 1")
    archs = args.archs
    start = time.perf_counter()
    sizes = export(archs, workers=args.jobs)
    print(f"{len(archs)} architectures compiled in {time.perf_counter() - start:.1f} s")
    for arch, by_label in sizes.items():
        print(f"{arch}: {len(by_label)} kernels")
        for label, size in by_label.items():
            print(f"  {label}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
