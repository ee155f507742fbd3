"""Random SSD inputs, one recipe for the tests and the benchmarks."""

from __future__ import annotations

import torch
from torch import Tensor


def random_inputs(
    b: int,
    l: int,
    h: int,
    p: int,
    g: int,
    n: int,
    dtype: torch.dtype = torch.float32,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    D: bool = True,
    dt_bias: bool = True,
    init: bool = False,
    dt_dtype: torch.dtype | None = None,
) -> dict[str, Tensor | None]:
    """Inputs of `kernels.ssd` drawn from a seeded CPU generator, so every device sees the same values.

    x (b, l, h, p), B and C (b, l, g, n) scaled by n**-0.5, in `dtype`; dt (b, l, h) around -1 (softplus
    gives ~0.3) in `dt_dtype` (default `dtype`); A (h,) negative, D, dt_bias (h,) and initial_states
    (b, h, p, n) in float32 (float64 when dtype is), or None when switched off.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    param = torch.float64 if dtype == torch.float64 else torch.float32

    def r(*shape: int, scale: float = 1.0, dt: torch.dtype = param) -> Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dt)

    return dict(
        x=r(b, l, h, p, dt=dtype),
        dt=(r(b, l, h, scale=0.5) - 1.0).to(dt_dtype or dtype),
        A=-torch.exp(r(h, scale=0.5)),
        B=r(b, l, g, n, scale=n**-0.5, dt=dtype),
        C=r(b, l, g, n, scale=n**-0.5, dt=dtype),
        D=r(h) if D else None,
        dt_bias=r(h, scale=0.5) if dt_bias else None,
        initial_states=r(b, h, p, n) if init else None,
    )
