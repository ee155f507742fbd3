"""The cuTile compiler check: an old toolkit in CUDA_HOME or a missing compiler is named in one line."""

from __future__ import annotations

import re
import stat

from kernels.cutile import toolchain


def _fake_ptxas(directory, release: str):
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    ptxas = bin_dir / "ptxas"
    ptxas.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    ptxas.chmod(ptxas.stat().st_mode | stat.S_IEXEC)
    return directory


def test_old_toolkit_in_cuda_home_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(_fake_ptxas(tmp_path / "cuda-12.0", "12.0")))
    toolchain.problem.cache_clear()
    try:
        assert re.search(r"CUDA_HOME=.*cuda-12.0 holds ptxas 12.0, older than tileiras", toolchain.problem())
    finally:
        toolchain.problem.cache_clear()


def test_new_enough_toolkit_in_cuda_home_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(_fake_ptxas(tmp_path / "cuda-99.0", "99.0")))
    toolchain.problem.cache_clear()
    try:
        assert toolchain.problem() is None
    finally:
        toolchain.problem.cache_clear()


def test_missing_compiler_is_named(monkeypatch):
    monkeypatch.setattr(toolchain, "_tileiras_path", lambda: None)
    toolchain.problem.cache_clear()
    try:
        assert re.search(r"tileiras.*pip install 'cuda-tile\[tileiras\]'", toolchain.problem())
    finally:
        toolchain.problem.cache_clear()
