"""Random SSD inputs, one recipe for the tests and the benchmarks, and the error measure they are compared by."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import reference, reference_backward


def rel_err(out: Tensor, ref: Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; fails on any non-finite value."""
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite values in output"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


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


def stage_inputs(
    dtype: torch.dtype,
    chunk: int,
    p: int,
    n: int,
    *,
    b: int = 2,
    l: int | None = None,
    h: int = 4,
    g: int = 2,
    seed: int = 0,
    device: str | torch.device = "cuda",
) -> dict[str, Tensor | None]:
    """Everything a forward or backward stage takes, for checking one stage alone.

    The inputs of `random_inputs` (init states on, rounded to `dtype`), dy (b, l, h, p) in `dtype` and
    dfinal (b, h, p, n) float32, and the upstream quantities computed in float64 by the reference
    stages: dt_out, dA_cumsum, chunk_states, final_state, dstates, dinitial_states.
    l defaults to 2 * chunk + 37 (a short last chunk).
    """
    l = 2 * chunk + 37 if l is None else l
    t: dict[str, Tensor | None] = dict(random_inputs(b, l, h, p, g, n, dtype, seed=seed, device=device, init=True))
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    t["dy"] = torch.randn(b, l, h, p, generator=gen).to(device, dtype)
    t["dfinal"] = torch.randn(b, h, p, n, generator=gen).to(device)
    f64 = {k: None if v is None else v.to(torch.float64) for k, v in t.items()}
    dt_out, dA = reference.chunk_cumsum(f64["dt"], f64["A"], chunk, f64["dt_bias"], True)
    states, final = reference.fwd_pass_state(f64["x"], f64["B"], dt_out, dA, f64["initial_states"])
    dstates, dinit = reference_backward.bwd_pass_state(f64["dy"], f64["C"], dA, f64["dfinal"])
    # dt_out as the cuTile chunk_cumsum returns it (contiguous; the reference's is a permuted view): the kernels
    # are compiled per memory layout, so a test in another layout would run a variant production never launches.
    dt_out = dt_out.contiguous()
    t.update(dt_out=dt_out, dA_cumsum=dA, chunk_states=states, final_state=final, dstates=dstates, dinit=dinit)
    return t
