"""scripts/generate.py with the model on a CUDA GPU: tokens are drawn on the CPU, so a seed gives one text on a
device, and the text the CPU gives."""

from __future__ import annotations

import pytest
import torch

import train
from tests.helpers import run_script, tiny_args

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, corpus):
    """A few CPU steps of the tiny model with the torch SSD: a checkpoint to sample from, nothing heavy."""
    root = tmp_path_factory.mktemp("trained")
    train.main(
        tiny_args(
            root,
            corpus,
            "--trainer.accelerator=cpu",
            "--trainer.precision=32-true",
            "--model.config.ssd_backend=torch",
            "--trainer.max_steps=6",
            "--checkpoint.every_n_train_steps=6",
            "--logging.wandb=false",
        )
    )
    return root / "checkpoints" / "last.ckpt"


def _generate(checkpoint, device: str, *args: str) -> str:
    done = run_script(
        "scripts/generate.py", str(checkpoint), "--prompt", "def ", "--device", device, *args, keep_devices=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("def ")
    return done.stdout


def test_generate_on_cuda_gives_one_text_per_seed_and_the_cpus(checkpoint):
    """Sampling once failed on cuda (a CPU generator handed to a draw on the GPU)."""
    sampled = ("--max_new_tokens", "24", "--top_k", "20", "--temperature", "1.0", "--seed", "3")
    on_cuda = [_generate(checkpoint, "cuda", *sampled) for _ in range(2)]
    assert on_cuda[0] == on_cuda[1]
    # float32 on both devices (no TF32: generate.py leaves torch's matmul precision at "highest")
    assert on_cuda[0] == _generate(checkpoint, "cpu", *sampled)
    greedy = ("--max_new_tokens", "24", "--temperature", "0")
    assert _generate(checkpoint, "cuda", *greedy) == _generate(checkpoint, "cpu", *greedy)
