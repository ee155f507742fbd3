"""Training on the GPU: the cutile (and triton) backends track the torch backend's loss curve."""

from __future__ import annotations

import pytest
import torch

import kernels
import train
from tests.helpers import read_metrics, series, tiny_args, write_corpus

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# bf16 autocast in every run; the backends differ in operand precision inside the SSD
# (bf16/TF32 products in cuTile and Triton, fp32 in the reference), so curves agree to a few 1e-2.
LOSS_TOL = 0.05


def _losses(tmp_path, backend: str, corpus):
    root = tmp_path / backend
    train.main(
        tiny_args(
            root,
            corpus,
            f"--model.config.ssd_backend={backend}",
            "--model.config.d_model=128",
            "--model.config.headdim=64",
            "--model.config.d_state=64",
            "--model.config.chunk_size=64",
            "--data.seq_len=256",
            "--trainer.max_steps=60",
            "--trainer.val_check_interval=30",
            "--logging.wandb=false",
        )
    )
    return series(read_metrics(root), "train/loss")


@pytest.mark.parametrize("backend", ["cutile", "triton"])
def test_backend_tracks_torch_loss_curve(tmp_path, backend):
    reason = kernels.unavailable_reason(backend, "cuda")
    if reason is not None:
        pytest.skip(reason)
    corpus = write_corpus(tmp_path / "corpus", n_files=30, lines=120)
    ref = _losses(tmp_path, "torch", corpus)
    got = _losses(tmp_path, backend, corpus)
    assert sorted(got) == sorted(ref) and len(ref) >= 50
    diffs = [abs(got[s] - ref[s]) for s in ref]
    assert max(diffs) < LOSS_TOL, f"max |loss difference| {max(diffs):.4f}"
    assert got[max(got)] < got[min(got)] - 1.0  # and it learns
