"""The machine a run or a measurement ran on: GPU, driver, CUDA and package versions, host, date; GPU peaks."""

from __future__ import annotations

import datetime
import hashlib
import importlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

PEAK_BF16_TFLOPS = {"H200": 989.5, "H100": 989.5, "A100": 312.0}  # datasheet dense bf16, per GPU


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    return getattr(mod, "__version__", "unknown")


ROOT = Path(__file__).resolve().parents[1]
CODE = (
    "train.py",
    "kernels",
    "model",
    "lightning_modules",
    "data",
    "scripts",
    "bench",
    "configs",
)  # what a measurement runs


def code_fingerprint(root: Path = ROOT) -> str:
    """A hash of the project's code (the Python, YAML and shell files under CODE): it names the code a figure
    was measured on where the copy that ran has no git history (GPU machines); the same call on a checkout
    of a commit tells whether that commit is the code measured."""
    digest = hashlib.sha256()
    for top in CODE:
        path = root / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in (".py", ".yaml", ".sh"))
        for f in files:
            if "__pycache__" in f.parts:
                continue
            digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git_commit(root: Path = ROOT) -> str | None:
    """HEAD of the checkout this project is (not of a repository around a copy of it), "+dirty" when the code
    files differ from it."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None
    head = _git(root, "rev-parse", "HEAD")
    if not head:
        return None
    changed = _git(root, "status", "--porcelain", "--", *CODE)
    return head + ("+dirty" if changed else "")


def process_age_s() -> float | None:
    """Seconds since this process started, from the OS (Linux's /proc); None where the OS does not say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def environment() -> dict[str, Any]:
    """GPU, driver, CUDA and package versions, host, date, and the code measured (git commit where the
    checkout has one, and a fingerprint of the code either way): stored beside every figure."""
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "code": code_fingerprint(),
        "python": platform.python_version(),
        "host": platform.node(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": _version("triton"),
        "cuda_tile": _version("cuda.tile"),
        "mamba_ssm": _version("mamba_ssm"),
        "lightning": _version("lightning"),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = props.name
        env["gpu_count"] = torch.cuda.device_count()
        env["sm_count"] = props.multi_processor_count
        env["capability"] = f"{props.major}.{props.minor}"
        try:
            env["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, IndexError, subprocess.SubprocessError):
            env["driver"] = None
    else:
        env["gpu"] = None
    return env


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak TFLOP/s of a known GPU (matched by name, e.g. "NVIDIA H200"), else None."""
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return value
    return None
