"""Can cuTile compile here? One answer, asked once, before the first launch (kernels.backends calls it).

tileiras lowers sm_90 kernels through the ptxas it finds; with CUDA_HOME set it may take
$CUDA_HOME/bin/ptxas, and an older one fails every kernel with "failed to compile Tile IR program".
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess


def _release(text: str) -> tuple[int, int] | None:
    m = re.search(r"release (\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _version_of(binary: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return _release(out)


def _tileiras_path() -> str | None:
    try:
        from cuda.tile._compile import _find_compiler_bin

        return _find_compiler_bin().path
    except (ImportError, FileNotFoundError, AttributeError):
        return shutil.which("tileiras")


@functools.cache
def problem() -> str | None:
    """Why cuTile's compiler cannot build kernels here (missing tileiras, older ptxas in CUDA_HOME), or None."""
    tileiras = _tileiras_path()
    if tileiras is None:
        return (
            "cuTile's compiler `tileiras` was not found. Install it with "
            "`pip install 'cuda-tile[tileiras]'`, or put a CUDA 13.1+ toolkit's bin/ on PATH."
        )
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        ptxas = os.path.join(cuda_home, "bin", "ptxas")
        home_version, tile_version = _version_of(ptxas), _version_of(tileiras)
        if home_version and tile_version and home_version < tile_version:
            return (
                f"CUDA_HOME={cuda_home} holds ptxas {home_version[0]}.{home_version[1]}, older than "
                f"tileiras {tile_version[0]}.{tile_version[1]} ({tileiras}); cuTile would compile with it "
                "and fail. Unset CUDA_HOME (and CUDA_PATH), or point it at a toolkit at least as new."
            )
    return None
