"""Several processes on the CPU (gloo): Lightning DDP, FSDP against DDP, two processes against one with the same
global batch, and Lightning's multi-node launch through torchrun.

DDP relaunches the script for its other ranks, so the runs of several processes are train.py in subprocesses, one
after the other (two cores run them no faster side by side); the two-process DDP run is made once, for every test
that compares with it.

Lightning refuses FSDP on a CPU, and torch's FSDP needs `device_id=cpu` and no CPU offload of the state dict
there: `CPUFSDP` below is our FSDPStrategy with just those two changes, so that train.py's FSDP path (sharded
flat parameters, the weight-decay groups, clipping over all shards, full-state-dict checkpoints) runs in two
gloo processes. On GPUs, tests/training/test_multi_gpu.py runs `--trainer.strategy fsdp` itself.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FullStateDictConfig, OptimStateKeyType, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.api import FullOptimStateDictConfig

import train
from lightning_modules import strategies
from lightning_modules.checkpoint import read_checkpoint
from tests.helpers import ROOT, read_metrics, series, subprocess_env, tiny_args

CPU = ("--trainer.accelerator=cpu", "--logging.wandb=false")
GLOBAL_LOSS = "--trainer.callbacks+=tests.training.test_multi_gpu.GlobalLoss"  # the loss averaged over the ranks


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(root: Path, corpus: Path, *extra: str, cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    """train.py on the CPU in a subprocess, as a user starts it; it must succeed."""
    args = tiny_args(root, corpus, *CPU, *extra, cache_dir=cache_dir)
    done = subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, corpus) -> tuple[Path, str]:
    """Two processes with batch 4, logging the loss averaged over the ranks: its root and its stderr. Its data cache
    is its own, so that the tokenizing shows: the processes share it."""
    root = tmp_path_factory.mktemp("ddp")
    done = _train(root, corpus, "--trainer.devices=2", "--trainer.strategy=ddp", GLOBAL_LOSS)
    return root, done.stderr


def test_two_process_ddp_on_cpu(ddp):
    root, stderr = ddp
    rows = read_metrics(root)
    assert len(series(rows, "train/loss")) == 12
    last = [r for r in rows if "time/step_ms_rank1" in r][-1]
    assert last["time/step_ms_max"] == max(last["time/step_ms_rank0"], last["time/step_ms_rank1"])
    assert (root / "checkpoints" / "last.ckpt").is_file()
    # One process per machine tokenizes (prepare_data); the other reads the cache: one set of progress bars.
    for desc in ("tokenizing train:   0%", "tokenizing val:   0%"):
        assert stderr.count(desc) == 1, f"{desc!r} shown {stderr.count(desc)} times"


def test_fsdp_matches_ddp_on_cpu(ddp, tmp_path, corpus, data_cache):
    """Same data, same seed, float32: FSDP's sharded step is DDP's step (weight decay, clipping, checkpoint)."""
    strategy = '--trainer.strategy={"class_path": "tests.training.test_ddp.CPUFSDP"}'
    done = _train(tmp_path, corpus, "--trainer.devices=2", strategy, cache_dir=data_cache)
    for name, stderr in (("ddp", ddp[1]), ("fsdp", done.stderr)):  # one line per job, not per rank
        assert stderr.count("SSD backend auto -> torch") == 1, name
    roots = {"ddp": ddp[0], "fsdp": tmp_path}
    ddp_loss, fsdp_loss = (series(read_metrics(roots[n]), "train/loss") for n in ("ddp", "fsdp"))
    assert sorted(ddp_loss) == sorted(fsdp_loss) and len(ddp_loss) == 12
    diffs = [abs(ddp_loss[s] - fsdp_loss[s]) for s in ddp_loss]
    assert max(diffs) < 1e-5, f"max |loss difference| {max(diffs):.2e}"
    assert ddp_loss[11] < ddp_loss[0] - 0.5  # and it learns
    # The FSDP checkpoint holds the whole model (a full state dict), as DDP's does, with the same weights.
    a = read_checkpoint(roots["ddp"] / "checkpoints" / "last.ckpt")
    b = read_checkpoint(roots["fsdp"] / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 12
    assert {k: v.shape for k, v in a["state_dict"].items()} == {k: v.shape for k, v in b["state_dict"].items()}
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][k], v, rtol=1e-4, atol=1e-5, msg=k)


def test_two_processes_match_one_with_the_same_global_batch_on_cpu(ddp, tmp_path, corpus, data_cache):
    """DDP over two processes with batch B trains as one process with batch 2B (float32: to rounding). The one
    process is this one: a single process has nothing to relaunch."""
    train.main(tiny_args(tmp_path, corpus, *CPU, "--data.batch_size=8", GLOBAL_LOSS, cache_dir=data_cache))
    two, one = (series(read_metrics(root), "train/global_loss") for root in (ddp[0], tmp_path))
    assert sorted(one) == sorted(two) and len(one) == 12
    diffs = [abs(one[s] - two[s]) for s in one]
    assert max(diffs) < 1e-5, f"max |loss difference| {max(diffs):.2e}"


def test_two_nodes_through_torchrun_agree_on_weights(tmp_path, corpus):
    """Two one-process "nodes" on loopback, launched as a cluster would launch them; each fills its own data cache,
    as separate machines do."""
    root = tmp_path / "run"
    port = str(_free_port())
    procs = []
    for node in (0, 1):
        args = tiny_args(
            root,
            corpus,
            *CPU,
            "--trainer.num_nodes=2",
            "--trainer.strategy=ddp",
            "--trainer.callbacks+=tests.helpers.DumpWeights",
            cache_dir=tmp_path / f"cache{node}",
        )
        launcher = ["-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1"]
        cmd = [sys.executable, *launcher, "--master_addr=127.0.0.1", f"--master_port={port}", "train.py", *args]
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    w0 = torch.load(root / "weights_rank0.pt", weights_only=True)
    w1 = torch.load(root / "weights_rank1.pt", weights_only=True)
    assert w0.keys() == w1.keys()
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    assert len(series(read_metrics(root), "train/loss")) == 12  # rank 0 logged every step of the shared run
