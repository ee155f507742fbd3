"""A kernel's ahead-of-time specializations: the argument constraints `cuda.tile.compilation` compiles it for.

Each kernel module of kernels/cutile declares, beside its kernel, `aot_signatures()`: an iterator of
(label, kernel, signature) triples, the specializations its launches compile, built with the helpers here. A label
is the stage (the kernel's name without `_kernel`) and its constants in brackets, with `,occupancy=N]` where the
launch gives a hint. The first triple of each kernel, which the default test run compiles, is its default
configuration: at bf16 inputs where that builds in seconds. `bench.aot` compiles them to cubins with no GPU present.
"""

from __future__ import annotations

from typing import Any

import cuda.tile as ct
import torch
from cuda.tile import compilation as ctc

from kernels.cutile.launch import with_hints

# The inputs' dtypes the specializations cover, by their torch names (as labels write them).
DTYPES = {"bfloat16": ct.bfloat16, "float16": ct.float16, "float32": ct.float32}

Specialization = tuple[str, Any, ctc.KernelSignature]  # (label, kernel with its launch's hints, signature)


def cutile_dtype(dtype: torch.dtype) -> Any:
    """The cuTile dtype of a torch dtype of DTYPES (KeyError for others)."""
    return DTYPES[str(dtype).removeprefix("torch.")]


def array(dtype: Any, ndim: int, index_dtype: Any = ct.int64, divisible: tuple[int, ...] = (), base: int = 1) -> Any:
    """An array argument of `ndim` dimensions with its last stride 1. The specializations assume nothing more; a
    launch may also specialize on 32-bit indices (`index_dtype`), the other strides' divisors (`divisible`, one per
    dimension but the last) and the base address's (`base`)."""
    return ctc.ArrayConstraint(
        dtype,
        ndim,
        index_dtype=index_dtype,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[*divisible, 1] if divisible else 1,
        base_addr_divisible_by=base,
    )


def seq_idx_params(given: bool) -> list:
    """The SSD kernels' last two parameters, seq_idx and HAS_SEQ_IDX, as the host passes them
    (kernels.cutile.launch.seq_idx_args): (b, l) int32 document ids and True when `given`, else the (b, h, c·Q)
    float32 rows standing in for them and False."""
    return [array(ct.int32, 2) if given else array(ct.float32, 3), given]


def scalar(dtype: Any = ct.int32) -> Any:
    """A run-time scalar argument (an int32 count by default)."""
    return ctc.ScalarConstraint(dtype)


def kernel_signature(params: list) -> ctc.KernelSignature:
    """The signature of a kernel taking `params` in order: constraints (`array`, `scalar`) or constant values."""
    return ctc.KernelSignature(params, calling_convention=ctc.CallingConvention.cutile_python_v2())


def hinted(label: str, kernel: Any, occupancy: int, worker_warps: int = 0) -> tuple[str, Any]:
    """The label and kernel object a launch with these hints compiles (as the host functions' with_hints calls):
    unchanged without hints, else the label ends in `,occupancy=N]`."""
    if occupancy == 1 and not worker_warps:
        return label, kernel
    return f"{label[:-1]},occupancy={occupancy}]", with_hints(kernel, occupancy, worker_warps)
