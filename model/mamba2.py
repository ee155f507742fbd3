"""A Mamba-2 language model in one file (nn.Module, no Lightning here).

    tokens -> embedding -> n_layer x [x + Mamba2Block(RMSNorm(x))] -> RMSNorm -> LM head (tied)

Mamba2Block (Dao & Gu, 2024):
    in_proj: d_model -> (z, xBC, dt)       z, x: d_inner = expand * d_model;  B, C: ngroups * d_state each
    xBC = SiLU(causal depthwise conv1d(xBC))
    y   = SSD(x, dt, A, B, C, D, dt_bias)  via kernels.ssd (backend and backward fixed by the config)
    y   = RMSNorm(y * SiLU(z)) per group;   out_proj: d_inner -> d_model
The work around the SSD is in layers.py (fused under torch.compile, no copies in eager mode); the
loss goes through the tied head a chunk of tokens at a time (loss.py), never holding all the logits.

`forward(tokens)` gives logits, `forward(tokens, targets)` the mean cross-entropy; `step` runs one
token with a constant-size cache (conv window + SSM state) for generation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

import kernels
from kernels.reference import process_dt, ssd_step
from model.layers import causal_conv1d_silu, compute_dtype, rms_norm, split_linear
from model.loss import linear_cross_entropy

# conv_backend and norm_backend: the block's work around the SSD. "auto" picks per call: cutile where cuTile runs on
# the inputs' device (kernels.cutile_runs, a constant under torch.compile), else torch.
LAYER_BACKENDS = ("auto", "torch", "cutile")


def layer_backend(name: str, device: torch.device) -> str:
    """The concrete backend ("torch" or "cutile") that conv_backend or norm_backend `name` runs on `device`."""
    if name != "auto":
        return name
    return "cutile" if kernels.cutile_runs(device.type, device.index) else "torch"


def check_layer_backends(cfg: Mamba2Config, device: torch.device) -> None:
    """Raise ValueError naming the first of conv_backend and norm_backend set to "cutile" where cuTile cannot run on
    `device` ("auto" runs torch there)."""
    for key in ("conv_backend", "norm_backend"):
        if getattr(cfg, key) == "cutile" and (reason := kernels.unavailable_reason("cutile", device)):
            raise ValueError(f"model.config.{key} cutile cannot run here: {reason}; use {key} torch or auto")


@functools.cache
def _cutile_conv() -> Callable[..., tuple[Tensor, ...]]:
    from kernels.cutile.causal_conv import causal_conv1d_silu as cutile_conv

    return cutile_conv


@functools.cache
def _cutile_norm() -> Callable[..., Tensor]:
    from kernels.cutile.rms_norm import rms_norm as cutile_norm

    def norm(x: Tensor, weight: Tensor, eps: float, z: Tensor | None = None, group_size: int | None = None):
        return cutile_norm(x, weight, eps, z, group_size or x.shape[-1], compute_dtype(x))

    return norm


def _implementation(name: str, cutile: Callable[[], Callable[..., Tensor]], torch_fn: Callable[..., Tensor]):
    if name == "torch":
        return torch_fn
    if name == "cutile":
        return cutile()

    def auto(x: Tensor, *args, **kwargs) -> Tensor:
        fn = cutile() if layer_backend(name, x.device) == "cutile" else torch_fn
        return fn(x, *args, **kwargs)

    return auto


def _torch_conv_parts(
    x: Tensor, weight: Tensor, bias: Tensor | None, sizes: list[int], seq_idx: Tensor | None = None
) -> tuple[Tensor, ...]:
    return causal_conv1d_silu(x, weight, bias, seq_idx).split(sizes, dim=-1)  # views; fused by torch.compile


def conv_implementation(name: str) -> Callable[..., tuple[Tensor, ...]]:
    """The causal conv + SiLU of `name` (Mamba2Config.conv_backend): (x (b, l, c), weight (c, k), bias, sizes,
    seq_idx=None) -> y split along channels into parts of `sizes` (x, B, C); no tap crosses a document of seq_idx. The cutile op returns the parts as separate
    tensors and takes their gradients separately: no cat of the SSD's dx, dB, dC before the conv's backward."""
    return _implementation(name, _cutile_conv, _torch_conv_parts)


def norm_implementation(name: str) -> Callable[..., Tensor]:
    """The gated RMSNorm of `name` (Mamba2Config.norm_backend), with layers.rms_norm's signature."""
    return _implementation(name, _cutile_norm, rms_norm)


@dataclass
class Mamba2Config:
    """Everything that defines the model: sizes, initialisation, and which SSD implementation runs it.

    ssd_backend: "auto", "torch", "cutile" or "triton" (kernels.ssd; "auto" is resolved per device,
        cutile on a CUDA GPU where it runs, else torch, and logged); "standin" (y = x·D, kernels/standin.py)
        only for benchmarks that time the step without the SSD.
    ssd_backward: the cutile backend's backward, "reference" (autograd through kernels/reference.py)
        or "cutile" (the backward kernels), which needs ssd_backend "cutile": "auto" is refused with it, since it
        runs torch where cuTile cannot, and silently dropping the kernels would change what a run measures.
        The other backends have one backward each.
    vocab_size: train.py sets it from data.vocab_size.
    loss_chunk: tokens per chunk of the LM head + cross-entropy (loss.py): the logits held at once.
    conv_backend: the causal conv + SiLU, "torch" (layers.causal_conv1d_silu, fused by torch.compile),
        "cutile" (kernels/cutile/causal_conv.py, forward and backward kernels; CUDA only) or "auto" (cutile
        where cuTile runs on the inputs' device, else torch).
    norm_backend: the block's gated RMSNorm, "torch" (layers.rms_norm), "cutile" (kernels/cutile/rms_norm.py;
        CUDA only) or "auto", as conv_backend. The pre-norms of the residual stream stay layers.rms_norm.
    checkpoint_layers: recompute each block's activations (pre-norm + mixer) in the backward instead of keeping
        them (torch.utils.checkpoint, non-reentrant): about one more forward of the blocks for memory, at long L.
    """

    vocab_size: int = 4096
    d_model: int = 256
    n_layer: int = 4
    d_state: int = 64
    headdim: int = 32
    expand: int = 2
    ngroups: int = 1
    d_conv: int = 4
    chunk_size: int = 64
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    A_init_range: tuple[float, float] = (1.0, 16.0)
    norm_eps: float = 1e-5
    ssd_backend: str = "auto"
    ssd_backward: str = "reference"
    loss_chunk: int = 2048
    conv_backend: str = "torch"
    norm_backend: str = "torch"
    checkpoint_layers: bool = False

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        if self.ssd_backend not in (*kernels.BACKENDS, "auto"):
            raise ValueError(
                f"ssd_backend must be one of auto, {', '.join(kernels.BACKENDS)}; got {self.ssd_backend!r}"
            )
        if self.ssd_backward not in kernels.BACKWARDS:
            raise ValueError(f"ssd_backward must be one of {', '.join(kernels.BACKWARDS)}; got {self.ssd_backward!r}")
        if self.ssd_backward == "cutile" and self.ssd_backend != "cutile":
            auto = " (auto runs torch where cuTile cannot)" if self.ssd_backend == "auto" else ""
            raise ValueError(
                f"ssd_backward 'cutile' needs the cutile backend, got ssd_backend {self.ssd_backend!r}{auto}; "
                "set ssd_backend cutile or ssd_backward reference"
            )
        for name in ("conv_backend", "norm_backend"):
            if getattr(self, name) not in LAYER_BACKENDS:
                raise ValueError(f"{name} must be one of {', '.join(LAYER_BACKENDS)}; got {getattr(self, name)!r}")
        for name in (
            "vocab_size",
            "d_model",
            "n_layer",
            "d_state",
            "headdim",
            "ngroups",
            "expand",
            "d_conv",
            "chunk_size",
            "loss_chunk",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_inner % self.headdim != 0:
            raise ValueError(f"expand * d_model = {self.d_inner} must be divisible by headdim = {self.headdim}")
        if self.nheads % self.ngroups != 0:
            raise ValueError(f"nheads = {self.nheads} must be divisible by ngroups = {self.ngroups}")


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, optionally gated: norm(x * SiLU(z)), in groups of `group_size` (layers.rms_norm)."""

    def __init__(
        self, dim: int, eps: float = 1e-5, group_size: int | None = None, impl: Callable[..., Tensor] = rms_norm
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.group_size = group_size or dim
        self.impl = impl

    def forward(self, x: Tensor, z: Tensor | None = None) -> Tensor:
        return self.impl(x, self.weight, self.eps, z, self.group_size)


class Mamba2Block(nn.Module):
    """One Mamba-2 mixer; its SSD is kernels.ssd with the config's backend and backward."""

    def __init__(self, cfg: Mamba2Config, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.ssd_backend, self.ssd_backward = cfg.ssd_backend, cfg.ssd_backward
        self.conv = conv_implementation(cfg.conv_backend)
        d_inner, h, gn = cfg.d_inner, cfg.nheads, cfg.ngroups * cfg.d_state
        self.conv_dim = d_inner + 2 * gn
        self.in_proj = nn.Linear(cfg.d_model, 2 * d_inner + 2 * gn + h, bias=False)
        # Holds the conv's weight (conv_dim, 1, d_conv) and bias as mamba_ssm names and initialises them;
        # applied by layers.causal_conv1d_silu on channels-last activations.
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.d_conv, groups=self.conv_dim, padding=cfg.d_conv - 1)
        # dt_bias = softplus⁻¹(dt), dt log-uniform in [dt_min, dt_max]
        dt = torch.exp(torch.rand(h) * (math.log(cfg.dt_max) - math.log(cfg.dt_min)) + math.log(cfg.dt_min))
        dt = dt.clamp(min=cfg.dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(h).uniform_(*cfg.A_init_range)))
        self.D = nn.Parameter(torch.ones(h))
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        self.norm = RMSNorm(d_inner, cfg.norm_eps, d_inner // cfg.ngroups, norm_implementation(cfg.norm_backend))
        self.out_proj = nn.Linear(d_inner, cfg.d_model, bias=False)

    @property
    def _in_proj_sizes(self) -> list[int]:
        """in_proj's output as z, the conv's input xBC, and dt."""
        return [self.cfg.d_inner, self.conv_dim, self.cfg.nheads]

    def _split(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return zxbcdt.split(self._in_proj_sizes, dim=-1)

    @property
    def _xbc_sizes(self) -> list[int]:
        """The conv's channels as x, B and C."""
        gn = self.cfg.ngroups * self.cfg.d_state
        return [self.cfg.d_inner, gn, gn]

    def _split_xbc(self, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return xbc.split(self._xbc_sizes, dim=-1)

    def forward(self, u: Tensor, seq_idx: Tensor | None = None) -> Tensor:
        """u: (b, l, d_model) -> (b, l, d_model); seq_idx (b, l) int32 document ids: no state or conv tap crosses
        from one document into the next."""
        cfg = self.cfg
        b, l, _ = u.shape
        z, xbc, dt = split_linear(u, self.in_proj.weight, self._in_proj_sizes)
        x, B, C = self.conv(xbc, self.conv1d.weight[:, 0], self.conv1d.bias, self._xbc_sizes, seq_idx=seq_idx)
        y = kernels.ssd(
            x.reshape(b, l, cfg.nheads, cfg.headdim),
            dt,
            -torch.exp(self.A_log.float()),
            B.reshape(b, l, cfg.ngroups, cfg.d_state),
            C.reshape(b, l, cfg.ngroups, cfg.d_state),
            cfg.chunk_size,
            D=self.D,
            dt_bias=self.dt_bias,
            dt_softplus=True,
            seq_idx=seq_idx,
            backend=self.ssd_backend,
            backward=self.ssd_backward,
        )
        return self.out_proj(self.norm(y.reshape(b, l, cfg.d_inner), z))

    def allocate_cache(self, batch: int, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
        cfg = self.cfg
        return {
            "conv": torch.zeros(batch, self.conv_dim, cfg.d_conv, device=device, dtype=dtype),
            "ssm": torch.zeros(batch, cfg.nheads, cfg.headdim, cfg.d_state, device=device, dtype=torch.float32),
        }

    def step(self, u: Tensor, cache: dict[str, Tensor]) -> Tensor:
        """One token. u: (b, d_model) -> (b, d_model); cache updated in place."""
        cfg = self.cfg
        b = u.shape[0]
        z, xbc, dt = self._split(self.in_proj(u))
        conv = cache["conv"]
        conv.copy_(torch.roll(conv, shifts=-1, dims=-1))
        conv[:, :, -1] = xbc
        xbc = F.silu((conv * self.conv1d.weight.squeeze(1)).sum(-1) + self.conv1d.bias)
        x, B, C = self._split_xbc(xbc)
        y, cache["ssm"] = ssd_step(
            cache["ssm"],
            x.reshape(b, cfg.nheads, cfg.headdim),
            process_dt(dt, self.dt_bias, dt_softplus=True),
            -torch.exp(self.A_log.float()),
            B.reshape(b, cfg.ngroups, cfg.d_state),
            C.reshape(b, cfg.ngroups, cfg.d_state),
            self.D,
        )
        return self.out_proj(self.norm(y.reshape(b, cfg.d_inner).to(u.dtype), z))


def _block(norm: RMSNorm, layer: Mamba2Block, h: Tensor, seq_idx: Tensor | None) -> Tensor:
    """One residual branch, layer(norm(h)): what checkpoint_layers recomputes in the backward."""
    return layer(norm(h), seq_idx)


class Mamba2LM(nn.Module):
    """Mamba-2 language model: tokens (b, l) int64 -> logits (b, l, vocab_size), or the loss given targets."""

    def __init__(self, cfg: Mamba2Config):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.norms = nn.ModuleList(RMSNorm(cfg.d_model, cfg.norm_eps) for _ in range(cfg.n_layer))
        self.layers = nn.ModuleList(Mamba2Block(cfg, i) for i in range(cfg.n_layer))
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        nn.init.normal_(self.embedding.weight, std=0.02)
        for p in self.parameters():  # norms, biases, A_log, D, dt_bias; tagged while shapes are whole (FSDP flattens)
            if p.dim() < 2:
                p._no_weight_decay = True
        for layer in self.layers:  # scale residual-branch outputs down with depth, as GPT-2 and Mamba do
            with torch.no_grad():
                layer.out_proj.weight /= math.sqrt(cfg.n_layer)

    def forward(self, tokens: Tensor, targets: Tensor | None = None, seq_idx: Tensor | None = None) -> Tensor:
        """tokens (b, l) -> logits (b, l, vocab); with targets (b, l): the mean cross-entropy, a float32
        scalar, computed `cfg.loss_chunk` tokens at a time (no (b, l, vocab) logits). seq_idx (b, l) int32: the
        document of each token in packed rows (non-decreasing); each document is modelled as if alone."""
        h = self.embedding(tokens)
        recompute = self.cfg.checkpoint_layers and torch.is_grad_enabled()
        for norm, layer in zip(self.norms, self.layers):
            if recompute:
                h = h + torch.utils.checkpoint.checkpoint(_block, norm, layer, h, seq_idx, use_reentrant=False)
            else:
                h = h + _block(norm, layer, h, seq_idx)
        h = self.norm_f(h)
        if targets is None:
            return F.linear(h, self.embedding.weight)
        return linear_cross_entropy(h.flatten(0, 1), self.embedding.weight, targets.flatten(), self.cfg.loss_chunk)

    def allocate_cache(self, batch: int, device: torch.device, dtype: torch.dtype) -> list[dict[str, Tensor]]:
        return [layer.allocate_cache(batch, device, dtype) for layer in self.layers]

    def step(self, token: Tensor, cache: list[dict[str, Tensor]]) -> Tensor:
        """One token per sequence. token: (b,) int64 -> logits (b, vocab_size); cache updated in place."""
        h = self.embedding(token)
        for norm, layer, c in zip(self.norms, self.layers, cache):
            h = h + layer.step(norm(h), c)
        return F.linear(self.norm_f(h), self.embedding.weight)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def next_token_loss(model: Mamba2LM, tokens: Tensor, seq_idx: Tensor | None = None) -> Tensor:
    """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1]; tokens (b, l + 1) -> scalar. seq_idx
    (b, l) int32: the documents of the inputs tokens[:, :-1] (see data.tokenizer.document_ids), or None."""
    tokens = tokens.long()
    return model(tokens[:, :-1], tokens[:, 1:], seq_idx)
