"""The "ddp" and "fsdp" strategies (lightning_modules.strategies) in this process: the names Lightning resolves,
FSDP's mixed precision, the auto backend's line under several ranks. Training under them, several processes on
the CPU: tests/training/test_ddp.py.
"""

from __future__ import annotations

import logging

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import StrategyRegistry

import kernels.backends
from lightning_modules import strategies


def test_strategy_names_build_ours():
    for flag in ("ddp", "auto"):
        trainer = Trainer(accelerator="cpu", devices=2, strategy=flag, logger=False, enable_progress_bar=False)
        assert type(trainer.strategy) is strategies.DDPStrategy, flag
    assert StrategyRegistry["fsdp"]["strategy"] is strategies.FSDPStrategy


def test_fsdp_bf16_mixed_keeps_float32_parameters_and_reduction():
    ours = strategies.FSDPStrategy(precision_plugin=FSDPPrecision("bf16-mixed")).mixed_precision_config
    assert (ours.param_dtype, ours.reduce_dtype) == (torch.float32, torch.float32)
    lightnings = FSDPPrecision("bf16-mixed").mixed_precision_config  # what Lightning alone would use
    assert lightnings.param_dtype == torch.bfloat16
    given = strategies.FSDPStrategy(mixed_precision=lightnings, precision_plugin=FSDPPrecision("bf16-mixed"))
    assert given.mixed_precision_config is lightnings  # an explicit choice is kept


def test_auto_backend_line_on_global_rank_zero_only(monkeypatch, caplog):
    """Rank 0 says which backend auto chose (tests/kernels/test_ssd_entry.py); the other ranks choose silently."""
    monkeypatch.setenv("RANK", "1")
    kernels.backends._resolve.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="kernels"):
            assert kernels.backends.resolve("auto", "cpu") == "torch"
    finally:
        kernels.backends._resolve.cache_clear()
    assert "SSD backend auto" not in caplog.text
