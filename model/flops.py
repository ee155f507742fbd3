"""FLOPs of the Mamba-2 LM per token, for MFU, counted from the architecture (no profiler).

Forward, per layer and token (multiply-add = 2 FLOPs):
    in_proj   2 * d_model * (2 d_inner + 2 g n + h)
    conv1d    2 * conv_dim * d_conv
    SSD       2 * h * (Q n + Q p + 2 p n)     chunked form, full Q x Q blocks: C Bᵀ, scores·x, chunk state, C·state
    out_proj  2 * d_inner * d_model
plus the LM head 2 * d_model * vocab. A training step costs 3x the forward (backward = 2x).
"""

from __future__ import annotations

from model.mamba2 import Mamba2Config


def ssd_flops_per_token(cfg: Mamba2Config) -> float:
    """Forward FLOPs of one layer's SSD per token."""
    h, p, n, q = cfg.nheads, cfg.headdim, cfg.d_state, cfg.chunk_size
    return 2.0 * h * (q * n + q * p + 2 * p * n)


def forward_flops_per_token(cfg: Mamba2Config) -> float:
    """Forward FLOPs of the whole model per token (all layers and the LM head)."""
    gn = cfg.ngroups * cfg.d_state
    d_in_proj = 2 * cfg.d_inner + 2 * gn + cfg.nheads
    conv_dim = cfg.d_inner + 2 * gn
    per_layer = (
        2.0 * cfg.d_model * d_in_proj
        + 2.0 * conv_dim * cfg.d_conv
        + ssd_flops_per_token(cfg)
        + 2.0 * cfg.d_inner * cfg.d_model
    )
    return cfg.n_layer * per_layer + 2.0 * cfg.d_model * cfg.vocab_size


def train_flops_per_token(cfg: Mamba2Config) -> float:
    """Forward + backward FLOPs per token: 3x the forward."""
    return 3.0 * forward_flops_per_token(cfg)
