"""The SSD backends behind `kernels.ssd`, and how one is chosen.

    torch   kernels.reference.ssd_chunked: pure PyTorch, any device, differentiable by autograd
    cutile  kernels.cutile.ssd.ssd_cutile: cuTile forward; backward "reference" (autograd through the
            reference) or "cutile" (the backward kernels); needs a CUDA GPU, cuda-tile and its compiler
    triton  kernels.triton_backend.ssd_triton: mamba_ssm 2.3.2.post1 (CUDA GPU, mamba_ssm installed)
    standin kernels.standin.ssd_standin: y = x·D, any device; for the bench only (the rest of a step without the SSD)

`unavailable_reason` is the one answer to "can this backend run here, and if not why" (device, import,
compiler); `resolve` turns "auto" into cutile where that answer is yes, else torch, and logs the choice once.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

import torch

log = logging.getLogger("kernels")

BACKENDS = ("torch", "cutile", "triton", "standin")
BACKWARDS = ("reference", "cutile")  # the cutile backend's gradient: autograd through the reference, or kernels
GPU_BACKENDS = ("cutile", "triton")
INSTALL_HINTS = {"cutile": "pip install 'cuda-tile[tileiras]'", "triton": "install mamba_ssm 2.3.2.post1 and triton"}


_IMPLEMENTATIONS: dict[str, Callable] = {}  # backend name -> its function, imported on first use


def implementation(name: str) -> Callable:
    """The function of backend `name`, with kernels.ssd's signature up to seq_idx, positionally (cutile: and
    backward after it). Remembered in a plain dict: kernels.ssd calls this inside compiled graphs, where Dynamo
    traces a dict lookup silently but warns at every functools.cache wrapper."""
    fn = _IMPLEMENTATIONS.get(name)
    if fn is None:
        fn = _IMPLEMENTATIONS[name] = _import(name)
    return fn


def _import(name: str) -> Callable:
    if name == "torch":
        from kernels.reference import ssd_chunked

        return ssd_chunked
    if name == "standin":
        from kernels.standin import ssd_standin

        return ssd_standin
    if name == "cutile":
        from kernels.cutile.ssd import ssd_cutile

        return ssd_cutile
    if name == "triton":
        from kernels.triton_backend import ssd_triton

        return ssd_triton
    raise ValueError(f"unknown SSD backend {name!r}; choose one of {', '.join((*BACKENDS, 'auto'))}")


@functools.cache
def _import_error(name: str) -> str | None:
    try:
        implementation(name)
    except Exception as e:  # ImportError, or a broken install raising something else
        return f"{type(e).__name__}: {e}"
    return None


def unavailable_reason(name: str, device: torch.device | str) -> str | None:
    """Why backend `name` cannot run on `device`, or None when it can (the cuTile compiler included)."""
    if name not in BACKENDS:
        return f"unknown SSD backend {name!r}; choose one of {', '.join((*BACKENDS, 'auto'))}"
    device = torch.device(device)
    if name in GPU_BACKENDS:
        if not torch.cuda.is_available():
            return f"the {name} backend needs a CUDA GPU and torch sees none on this machine"
        if device.type != "cuda":
            return f"the {name} backend runs on a CUDA GPU, and the inputs are on {device.type}"
        if name == "cutile" and torch.cuda.get_device_capability(device) < (8, 0):
            return f"cuTile needs compute capability 8.0 or newer; {torch.cuda.get_device_name(device)} is older"
    err = _import_error(name)
    if err is not None:
        return f"the {name} backend could not be imported ({err}); {INSTALL_HINTS.get(name, '')}"
    if name == "cutile":
        from kernels.cutile.toolchain import problem

        return problem()
    return None


def _global_rank_zero() -> bool:
    """Whether this process is rank 0 of its distributed job, or in none (torch.distributed's rank once a
    process group exists, else the launcher's RANK variable)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


@functools.cache
def _cutile_runs(device_type: str, device_index: int | None) -> bool:
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    return unavailable_reason("cutile", device) is None


@torch.compiler.assume_constant_result
def cutile_runs(device_type: str, device_index: int | None = None) -> bool:
    """Whether cuTile kernels run on this device (`unavailable_reason` says none is in the way): what the model's
    conv and norm ask for "auto". Under torch.compile this runs once at trace time, a constant of the graph."""
    return _cutile_runs(device_type, device_index)


@functools.cache
def _resolve(name: str, device_type: str, device_index: int | None) -> str:
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    if name == "auto":
        reason = unavailable_reason("cutile", device)
        chosen = "cutile" if reason is None else "torch"
        why = "cuTile kernels on the GPU" if reason is None else f"pure PyTorch, because {reason}"
        if _global_rank_zero():  # one line per job, not one per rank
            log.warning("SSD backend auto -> %s (%s)", chosen, why)
        return chosen
    reason = unavailable_reason(name, device)
    if reason is not None:
        raise RuntimeError(f"SSD backend {name!r} cannot run here: {reason}")
    return name


@torch.compiler.assume_constant_result
def resolve(name: str, device_type: str, device_index: int | None = None) -> str:
    """The concrete backend for `name` on this device; raises RuntimeError if it cannot run.

    `auto` becomes cutile where cutile can run, else torch, and says so once per device (on global rank 0 only).
    Under torch.compile this runs once at trace time and its answer is a constant of the graph.
    """
    return _resolve(name, device_type, device_index)
