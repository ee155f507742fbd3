"""The SSD backends behind `kernels.ssd`, and how one is chosen.

    torch   kernels/reference.py: pure PyTorch, any device, differentiable by autograd
    cutile  kernels/cutile/: cuTile forward kernels, reference backward (CUDA GPU, cuda-tile)
    triton  mamba_ssm 2.3.2.post1's mamba_chunk_scan_combined (CUDA GPU, mamba_ssm installed)

`auto` picks cutile on a CUDA device where it can run, else torch, and logs the choice once.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger("kernels")

BACKENDS = ("torch", "cutile", "triton")


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # imported on first use
    function: str
    install_hint: str
    needs_cuda: bool


_SPECS = {
    "torch": Backend("torch", "kernels.reference", "ssd_chunked", "", needs_cuda=False),
    "cutile": Backend("cutile", "kernels.cutile.function", "ssd_fwd", "pip install 'cuda-tile[tileiras]'", True),
    "triton": Backend(
        "triton", "kernels.triton_backend", "ssd_triton", "install mamba_ssm 2.3.2.post1 and triton", True
    ),
}
_loaded: dict[str, Callable] = {}


def _import_error(name: str) -> str | None:
    """Import backend `name`'s module once; the error text if that fails."""
    if name in _loaded:
        return None
    spec = _SPECS[name]
    try:
        _loaded[name] = getattr(importlib.import_module(spec.module), spec.function)
    except Exception as e:  # ImportError, or a broken install raising something else
        return f"{type(e).__name__}: {e}"
    return None


def unavailable_reason(name: str, device: torch.device | str) -> str | None:
    """Why backend `name` cannot run on `device`, or None when it can."""
    if name not in _SPECS:
        return f"unknown SSD backend {name!r}; choose one of {', '.join((*BACKENDS, 'auto'))}"
    spec = _SPECS[name]
    device = torch.device(device)
    if spec.needs_cuda:
        if not torch.cuda.is_available():
            return f"the {name} backend needs a CUDA GPU and torch sees none on this machine"
        if device.type != "cuda":
            return f"the {name} backend runs on a CUDA GPU, and the inputs are on {device.type}"
        if name == "cutile" and torch.cuda.get_device_capability(device) < (8, 0):
            return f"cuTile needs compute capability 8.0 or newer; {torch.cuda.get_device_name(device)} is older"
    err = _import_error(name)
    if err is not None:
        return f"the {name} backend could not be imported ({err}); {spec.install_hint}"
    return None


@functools.cache
def _resolve(name: str, device_type: str, device_index: int | None) -> str:
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    if name == "auto":
        reason = unavailable_reason("cutile", device)
        chosen = "cutile" if reason is None else "torch"
        why = "cuTile kernels on the GPU" if reason is None else f"pure PyTorch, because {reason}"
        log.warning("SSD backend auto -> %s (%s)", chosen, why)
        _import_error(chosen)
        return chosen
    reason = unavailable_reason(name, device)
    if reason is not None:
        raise RuntimeError(f"SSD backend {name!r} cannot run here: {reason}")
    return name


@torch.compiler.assume_constant_result
def resolve(name: str, device_type: str, device_index: int | None = None) -> str:
    """The concrete backend for `name` on this device; raises RuntimeError if it cannot run.

    `auto` becomes cutile where cutile can run, else torch, and says so once per device.
    Under torch.compile this runs once at trace time and its answer is a constant of the graph.
    """
    return _resolve(name, device_type, device_index)


def implementation(name: str) -> Callable:
    """The function of a backend that `resolve` returned: kernels.ssd's signature up to initial_states."""
    return _loaded[name]
