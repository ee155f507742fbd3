"""The "ddp" and "fsdp" strategies (lightning_modules.strategies) and what LanguageModel does under them, on the CPU.

Lightning refuses FSDP on a CPU, and torch's FSDP needs `device_id=cpu` and no CPU offload of the state dict
there: `CPUFSDP` below is our FSDPStrategy with just those two changes, so that train.py's FSDP path (sharded
flat parameters, the weight-decay groups, clipping over all shards, full-state-dict checkpoints) runs in two
gloo processes. On GPUs, tests/training/test_multi_gpu.py runs `--trainer.strategy fsdp` itself.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import StrategyRegistry
from torch.distributed.fsdp import FullStateDictConfig, OptimStateKeyType, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.api import FullOptimStateDictConfig

import kernels.backends
from lightning_modules import strategies
from lightning_modules.checkpoint import read_checkpoint
from tests.helpers import ROOT, read_metrics, series, subprocess_env, tiny_args, write_corpus


class CPUFSDP(strategies.FSDPStrategy):
    """Our FSDPStrategy in CPU processes (gloo): FSDP wrapped with device_id=cpu, full state dicts not offloaded."""

    def _setup_model(self, model):
        return FSDP(model, device_id=torch.device("cpu"), sharding_strategy=self.sharding_strategy, **self.kwargs)

    def _full_state_dict(self):
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        optim = FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True)
        return FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT, config, optim)

    def lightning_module_state_dict(self):
        with self._full_state_dict():
            return self.model.state_dict()

    def optimizer_state(self, optimizer):
        optimizer = getattr(optimizer, "_optimizer", optimizer)
        with self._full_state_dict():
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state


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


def _train(root, corpus, strategy: str) -> subprocess.CompletedProcess:
    args = tiny_args(
        root,
        corpus,
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        f"--trainer.strategy={strategy}",
        "--logging.wandb=false",
    )
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_fsdp_matches_ddp_on_cpu(tmp_path):
    """Same data, same seed, float32: FSDP's sharded step is DDP's step (weight decay, clipping, checkpoint)."""
    corpus = write_corpus(tmp_path / "corpus", n_files=16)
    runs = {
        "ddp": _train(tmp_path / "ddp", corpus, "ddp"),
        "fsdp": _train(tmp_path / "fsdp", corpus, '{"class_path": "tests.training.test_strategies.CPUFSDP"}'),
    }
    for name, done in runs.items():
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        assert done.stderr.count("SSD backend auto -> torch") == 1, name  # one line per job, not per rank
    ddp, fsdp = (series(read_metrics(tmp_path / n), "train/loss") for n in ("ddp", "fsdp"))
    assert sorted(ddp) == sorted(fsdp) and len(ddp) == 12
    diffs = [abs(ddp[s] - fsdp[s]) for s in ddp]
    assert max(diffs) < 1e-5, f"max |loss difference| {max(diffs):.2e}"
    assert ddp[11] < ddp[0] - 0.5  # and it learns
    # The FSDP checkpoint holds the whole model (a full state dict), as DDP's does, with the same weights.
    a = read_checkpoint(tmp_path / "ddp" / "checkpoints" / "last.ckpt")
    b = read_checkpoint(tmp_path / "fsdp" / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 12
    assert {k: v.shape for k, v in a["state_dict"].items()} == {k: v.shape for k, v in b["state_dict"].items()}
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][k], v, rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
def test_two_processes_match_one_with_the_same_global_batch_on_cpu(tmp_path):
    """DDP over two processes with batch B trains as one process with batch 2B (float32: to rounding)."""
    corpus = write_corpus(tmp_path / "corpus", n_files=16)
    losses = {}
    for devices, batch in ((2, 4), (1, 8)):
        root = tmp_path / f"{devices}proc"
        args = tiny_args(
            root,
            corpus,
            "--trainer.accelerator=cpu",
            f"--trainer.devices={devices}",
            "--trainer.strategy=ddp",
            f"--data.batch_size={batch}",
            "--trainer.callbacks+=tests.training.test_multi_gpu.GlobalLoss",  # the loss averaged over the ranks
            "--logging.wandb=false",
        )
        done = subprocess.run(
            [sys.executable, "train.py", *args], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        losses[devices] = series(read_metrics(root), "train/global_loss")
    assert sorted(losses[1]) == sorted(losses[2]) and len(losses[1]) == 12
    diffs = [abs(losses[1][s] - losses[2][s]) for s in losses[1]]
    assert max(diffs) < 1e-5, f"max |loss difference| {max(diffs):.2e}"
