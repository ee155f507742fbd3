"""The SSD forward on the three cuTile kernels: input checks, layouts, tuned launches.

    chunk_cumsum   dt (b, l, h)            -> dt_out, dA_cumsum (b, h, c*Q) float32, token-contiguous
    fwd_pass_state x, B, dt_out, dA_cumsum -> chunk_states (b, c, h, p, n) float32, final_state (b, h, p, n)
    compute_out    x, B, C, ..., D         -> y (b, l, h, p) in x's dtype

Every launch runs on the inputs' device and that device's current stream.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

import cuda.tile as ct
import torch

from kernels.cutile import chunk_cumsum, compute_out, fwd_pass_state, tuning

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_CHUNKS = (16, 32, 64, 128, 256)
MAX_DIM = 256  # head dim and state dim, one tile each in compute_out


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
def check_toolchain() -> None:
    """Raise RuntimeError when cuTile's compiler is missing or CUDA_HOME points at an older toolkit.

    tileiras lowers sm_90 kernels through the ptxas it finds; with CUDA_HOME set it may take
    $CUDA_HOME/bin/ptxas, and an older one fails every kernel with "failed to compile Tile IR program".
    """
    tileiras = _tileiras_path()
    if tileiras is None:
        raise RuntimeError(
            "cuTile's compiler `tileiras` was not found. Install it with "
            "`pip install 'cuda-tile[tileiras]'`, or put a CUDA 13.1+ toolkit's bin/ on PATH."
        )
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        ptxas = os.path.join(cuda_home, "bin", "ptxas")
        home_version, tile_version = _version_of(ptxas), _version_of(tileiras)
        if home_version and tile_version and home_version < tile_version:
            raise RuntimeError(
                f"CUDA_HOME={cuda_home} holds ptxas {home_version[0]}.{home_version[1]}, older than "
                f"tileiras {tile_version[0]}.{tile_version[1]} ({tileiras}); cuTile would compile with it "
                "and fail. Unset CUDA_HOME (and CUDA_PATH), or point it at a toolkit at least as new."
            )


def check_inputs(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    initial_states: torch.Tensor | None,
) -> None:
    """Raise ValueError for inputs the kernels cannot take as they are (shapes are checked by kernels.ssd)."""
    tensors = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "dt_bias": dt_bias, "initial_states": initial_states}
    for name, t in tensors.items():
        if t is None:
            continue
        if not t.is_cuda:
            raise ValueError(f"cutile backend: {name} is on {t.device}; move the inputs to a CUDA device")
        if t.device != x.device:
            raise ValueError(f"cutile backend: {name} is on {t.device} but x is on {x.device}")
    for name, t in (("x", x), ("B", B), ("C", C), ("dt", dt)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"cutile backend: {name} has dtype {t.dtype}; supported: bfloat16, float16, float32")
        if t.stride(-1) != 1:
            raise ValueError(
                f"cutile backend: {name} has stride {t.stride(-1)} along its last dim; the kernels read it "
                f"in rows and would need a copy. Pass {name}.contiguous()."
            )
    if not (x.dtype == B.dtype == C.dtype):
        raise ValueError(f"cutile backend: x, B, C must share a dtype, got {x.dtype}, {B.dtype}, {C.dtype}")
    if chunk_size not in SUPPORTED_CHUNKS:
        raise ValueError(f"cutile backend: chunk_size {chunk_size} not supported; use one of {SUPPORTED_CHUNKS}")
    p, n = x.shape[-1], B.shape[-1]
    if p > MAX_DIM or n > MAX_DIM:
        raise ValueError(f"cutile backend: head dim {p} and state dim {n} must be at most {MAX_DIM}")


def ssd_forward(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked SSD forward on cuTile. Shapes as `kernels.ssd`.

    Returns:
        y: (b, l, h, p) in x's dtype.  final_state: (b, h, p, n) float32.
    """
    check_inputs(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states)
    check_toolchain()
    b, seqlen, h, p = x.shape
    g, n = B.shape[-2:]
    nchunks = -(-seqlen // chunk_size)
    dev = x.device
    f32 = torch.float32
    A32 = A.to(f32).contiguous()
    bias32 = None if dt_bias is None else dt_bias.to(f32).contiguous()
    D32 = None if D is None else D.to(f32).contiguous()
    init32 = None if initial_states is None else initial_states.to(f32).contiguous()
    shape_key = f"b{b}_l{seqlen}_h{h}_p{p}_g{g}_n{n}_Q{chunk_size}_{str(x.dtype)[6:]}"

    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        dt_out = torch.empty((b, h, nchunks * chunk_size), device=dev, dtype=f32)
        dA_cumsum = torch.empty_like(dt_out)
        chunk_states = torch.empty((b, nchunks, h, p, n), device=dev, dtype=f32)
        final_state = torch.empty((b, h, p, n), device=dev, dtype=f32)
        y = torch.empty((b, seqlen, h, p), device=dev, dtype=x.dtype)

        stages = (
            (
                "chunk_cumsum",
                chunk_cumsum.CumsumConfig(),
                lambda: chunk_cumsum.search_space(h),
                lambda cfg: chunk_cumsum.spec(cfg, dt, A32, bias32, dt_softplus, dt_out, dA_cumsum, chunk_size),
            ),
            (
                "fwd_pass_state",
                fwd_pass_state.StateConfig(),
                lambda: fwd_pass_state.search_space(p, n),
                lambda cfg: fwd_pass_state.spec(
                    cfg, x, B, dt_out, dA_cumsum, init32, chunk_states, final_state, chunk_size
                ),
            ),
            (
                "compute_out",
                compute_out.OutConfig(),
                lambda: compute_out.search_space(chunk_size, p),
                lambda cfg: compute_out.spec(cfg, x, B, C, dt_out, dA_cumsum, chunk_states, D32, y, chunk_size),
            ),
        )
        for name, default, space, spec in stages:
            cfg = tuning.choose(name, shape_key, default, space, dev, spec)
            grid, kernel, args = spec(cfg)
            try:
                ct.launch(stream, grid, kernel, args)
            except Exception as e:
                hint = ""
                if os.environ.get("CUDA_HOME"):
                    hint = f" CUDA_HOME={os.environ['CUDA_HOME']} is set: tileiras may be using its older ptxas."
                raise RuntimeError(
                    f"cuTile kernel {name} failed for x {tuple(x.shape)} {x.dtype}, B {tuple(B.shape)}, "
                    f"chunk_size {chunk_size}, config {cfg}: {e}.{hint}"
                ) from e
    return y, final_state
