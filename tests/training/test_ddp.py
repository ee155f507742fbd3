"""Several processes: Lightning DDP on CPU (gloo), and Lightning's multi-node launch through torchrun.

DDP relaunches the script for its other ranks, so these run train.py as subprocesses.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT, read_metrics, series, subprocess_env, tiny_args, write_corpus

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_on_cpu(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_files=16)
    root = tmp_path / "run"
    args = tiny_args(
        root,
        corpus,
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--logging.wandb=false",
    )
    done = subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(root)
    assert len(series(rows, "train/loss")) == 12
    last = [r for r in rows if "time/step_ms_rank1" in r][-1]
    assert last["time/step_ms_max"] == max(last["time/step_ms_rank0"], last["time/step_ms_rank1"])
    assert (root / "checkpoints" / "last.ckpt").is_file()
    # One process per machine tokenizes (prepare_data); the other reads the cache: one set of progress bars.
    for desc in ("tokenizing train:   0%", "tokenizing val:   0%"):
        assert done.stderr.count(desc) == 1, f"{desc!r} shown {done.stderr.count(desc)} times"


def test_two_nodes_through_torchrun_agree_on_weights(tmp_path):
    """Two one-process "nodes" on loopback, launched as a cluster would launch them."""
    corpus = write_corpus(tmp_path / "corpus", n_files=16)
    root = tmp_path / "run"
    port = str(_free_port())
    procs = []
    for node in (0, 1):
        args = tiny_args(
            root,
            corpus,
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.num_nodes=2",
            "--trainer.strategy=ddp",
            "--logging.wandb=false",
            "--trainer.callbacks+=tests.helpers.DumpWeights",
            f"--data.cache_dir={tmp_path / f'cache{node}'}",
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node_rank={node}",
            "--nproc_per_node=1",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            "train.py",
            *args,
        ]
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
