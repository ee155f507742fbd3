"""scripts/generate.py with the model on a CUDA GPU: tokens are drawn on the CPU, so a seed gives one text."""

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


def test_generate_on_cuda_samples_and_gives_one_text_per_seed(checkpoint):
    """Sampling once failed on cuda (a CPU generator handed to a draw on the GPU). Texts are not compared across
    devices: the few steps' flat logits leave near-ties that float rounding may break either way."""
    sampled = ("--max_new_tokens", "24", "--top_k", "20", "--temperature", "1.0", "--seed", "3")
    on_cuda = [_generate(checkpoint, "cuda", *sampled) for _ in range(2)]
    assert on_cuda[0] == on_cuda[1]
    assert on_cuda[0] != _generate(checkpoint, "cuda", *sampled[:-1], "4")  # another seed, another text
    greedy = [_generate(checkpoint, "cuda", "--max_new_tokens", "24", "--temperature", "0") for _ in range(2)]
    assert greedy[0] == greedy[1] and greedy[0].rstrip("\n") != "def "  # the same continuation, not an empty one
