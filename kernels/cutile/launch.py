"""Launching one cuTile stage: choose its configuration (kernels.cutile.tuning), launch it on the inputs'
device and that device's current stream, and turn a compile failure into an error naming the stage."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import cuda.tile as ct
import torch

from kernels.cutile import tuning
from kernels.reference import pad_seq_idx

# Names the kernel files share: compile-time parameters, zero padding of partial tiles, the TF32 operand type.
ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ZERO = ct.PaddingMode.ZERO
TF = ct.tfloat32
# The cuTile backward's chunk size at most, whatever the forward's: its programs hold chunk x chunk tiles, which
# spill at 128 (kernels.cutile.ssd composes the passes at it; their AOT specializations are built at it).
BACKWARD_CHUNK = 64

T = TypeVar("T")
Spec = Callable[[Any], tuple[tuple[int, ...], Any, tuple]]


ASSUMED_SMS = 132  # an H100's and an H200's SMs: the count default configurations assume off a GPU (CPU tests)


@functools.cache
def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors of `device`, or ASSUMED_SMS where it is not a CUDA device (asked once per
    device: every SSD launch takes it for its untuned default)."""
    if device.type != "cuda":
        return ASSUMED_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def shape_key(x: torch.Tensor, B: torch.Tensor, chunk_size: int, seq_idx: torch.Tensor | None = None) -> str:
    """The tuning key of an SSD shape: x (b, l, h, p), B (b, l, g, n), chunk size, input dtype, and "_seq_idx" with
    document boundaries: a kernel with seq_idx is another build (its masks take registers), tuned apart from the one
    without, whose keys (the shipped table's) stay as they were. Untuned, both take the same default."""
    b, seqlen, h, p = x.shape
    g, n = B.shape[-2:]
    key = f"b{b}_l{seqlen}_h{h}_p{p}_g{g}_n{n}_Q{chunk_size}_{str(x.dtype)[6:]}"
    return key if seq_idx is None else f"{key}_seq_idx"


def seq_idx_args(seq_idx: torch.Tensor | None, stand_in: torch.Tensor, tokens: int) -> tuple[torch.Tensor, bool]:
    """The SSD kernels' last two arguments, seq_idx and HAS_SEQ_IDX: (seq_idx, True), or without document boundaries
    (stand_in, False), stand_in an array of the launch the kernel then does not read (the (b, h, c·Q) float32 rows of
    dt_out or dA_cumsum, as kernels.cutile.signature.seq_idx_params declares). Last, so that a kernel's other arguments
    keep their places and its build without seq_idx is the one before seq_idx was added. The kernels load seq_idx in
    tiles of `tokens` (the chunk, or a walk's step): a row whose length is not a multiple of it is padded
    (kernels.reference.pad_seq_idx, a copy), so that every tile lies inside the array and padding joins the last
    document."""
    return (stand_in, False) if seq_idx is None else (pad_seq_idx(seq_idx, tokens), True)


def launch(name: str, key: str, default: T, space: Callable[[], Sequence[T]], spec: Spec, device: torch.device) -> T:
    """Launch stage `name` with the configuration tuning chooses for `key`; returns that configuration.

    Args:
        default: the configuration used when tuning is off and nothing is cached.
        space: the candidates tuning times (built only when it runs).
        spec: configuration -> (grid, kernel, args).
    """
    with torch.cuda.device(device):
        cfg = tuning.choose(name, key, default, space, device, spec)
        grid, kernel, args = spec(cfg)
        try:
            ct.launch(raw_stream(device), grid, kernel, args)
        except Exception as e:
            hint = ""
            if os.environ.get("CUDA_HOME"):
                hint = f" CUDA_HOME={os.environ['CUDA_HOME']} is set: tileiras may be using its older ptxas."
            raise RuntimeError(f"cuTile kernel {name} failed for {key}, config {cfg}: {e}.{hint}") from e
    return cfg


def raw_stream(device: torch.device) -> int:
    """The device's current stream as its raw handle (an int), which ct.launch takes as it takes a stream object:
    reading the handle costs the host less than building a torch.cuda.Stream object, and the launch is the same."""
    return torch._C._cuda_getCurrentRawStream(device.index)


def next_pow2(v: int, floor: int = 16) -> int:
    """The tile extent covering `v` elements: a power of two, at least `floor`."""
    return max(floor, 1 << (v - 1).bit_length())


def with_hints(kernel: Any, occupancy: int, worker_warps: int = 0) -> Any:
    """`kernel` with an occupancy hint and, unless 0, a number of worker warps per program: one object per
    combination, so cuTile's compile cache stays with it."""
    return _with_hints(kernel, occupancy, worker_warps)


@functools.cache
def _with_hints(kernel: Any, occupancy: int, worker_warps: int) -> Any:
    if worker_warps:
        return kernel.replace_hints(occupancy=occupancy, num_worker_warps=worker_warps)
    return kernel.replace_hints(occupancy=occupancy)
