"""The triton backend of `kernels.ssd`: mamba_ssm 2.3.2.post1's fused chunked scan (forward and backward).

Optional: importing this module fails where mamba_ssm is not installed, and `kernels.ssd` then says so.
"""

from __future__ import annotations

import torch
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
from torch import Tensor


def ssd_triton(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    initial_states: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """y (b, l, h, p) in x's dtype and final_state (b, h, p, n) from mamba_ssm's Triton kernels."""
    with torch.cuda.device(x.device):
        y, final_state = mamba_chunk_scan_combined(
            x,
            dt,
            A,
            B,
            C,
            chunk_size,
            D=D,
            dt_bias=dt_bias,
            initial_states=initial_states,
            dt_softplus=dt_softplus,
            return_final_states=True,
        )
    return y, final_state
