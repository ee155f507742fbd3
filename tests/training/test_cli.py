"""train.py's command line: its help, the keys it refuses, and configuration errors caught before training
(exit 2, one line) rather than in the first step."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import train
from lightning_modules.language_model import COMPILE_MODES
from model.mamba2 import Mamba2Config
from tests.helpers import default_sigint, run_script, tiny_args
from tests.training.test_errors import _fails_in_one_line

pytestmark = pytest.mark.slow


def test_help_shows_the_examples_as_written(capsys):
    with pytest.raises(SystemExit) as done:
        train.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "\n    python train.py --config configs/tiny.yaml --ckpt_path last              # resume\n" in out
    assert "--optimizer" not in out and "--lr_scheduler" not in out  # the optimizer is model.*'s


def test_optimizer_and_scheduler_keys_are_refused(tmp_path, corpus, capsys):
    line = _fails_in_one_line(capsys, tiny_args(tmp_path, corpus, "--optimizer=SGD"))
    assert "--optimizer" in line and "--help" in line


def test_model_settings_are_checked_before_training(tmp_path, corpus, capsys):
    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "a", corpus, "--model.compile_mode=fast"))
    assert "model.compile_mode must be one of" in line and "'fast'" in line
    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "b", corpus, "--model.config.ngroups=0"))
    assert "model.config: ngroups must be positive" in line
    # The cuTile backward with a backend that resolves to another one here (auto -> torch on a CPU)
    line = _fails_in_one_line(
        capsys, tiny_args(tmp_path / "c", corpus, "--model.config.ssd_backward=cutile", "--logging.wandb=false")
    )
    assert "ssd_backward 'cutile' needs the cutile backend" in line and "resolved to 'torch'" in line
    assert not (tmp_path / "c" / "checkpoints").exists()
    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "d", corpus, "--model.config.conv_backend=triton"))
    assert "conv_backend must be one of auto, torch, cutile; got 'triton'" in line
    # The cuTile conv where cuTile cannot run (no CUDA device here)
    for key in ("conv_backend", "norm_backend"):
        line = _fails_in_one_line(
            capsys, tiny_args(tmp_path / key, corpus, f"--model.config.{key}=cutile", "--logging.wandb=false")
        )
        assert f"model.config.{key} cutile cannot run here" in line and f"use {key} torch or auto" in line
        assert not (tmp_path / key / "checkpoints").exists()


def test_a_diverged_run_says_so_and_claims_no_checkpoint(tmp_path, corpus, capsys):
    args = tiny_args(tmp_path, corpus, "--model.lr=100", "--model.warmup_steps=1", "--trainer.max_steps=20")
    line = _fails_in_one_line(capsys, [*args, "--logging.wandb=false"], code=1)
    assert "diverged" in line and "No checkpoint was written yet." in line
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_data_errors_name_the_key(tmp_path, corpus, capsys):
    line = _fails_in_one_line(capsys, tiny_args(tmp_path, corpus, "--data.batch_size=0"))
    assert "data.batch_size must be positive, got 0" in line


def test_ctrl_c_while_the_libraries_load_ends_in_one_line(tmp_path):
    """SIGINT in the middle of `import torch` (python -X importtime reports each finished import on stderr,
    so the signal is sent once a module inside torch has loaded and before torch itself has)."""
    root = Path(train.__file__).resolve().parent
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "train.py", "--config", "configs/tiny.yaml", "--trainer.max_steps", "1"]
        + ["--trainer.default_root_dir", str(tmp_path), "--logging.wandb", "false"],
        cwd=root,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.split("|")[-1].strip() == "torch._C":  # torch's extension loaded, its __init__ still running
                proc.send_signal(signal.SIGINT)
                break
        assert lines and lines[-1].split("|")[-1].strip() == "torch._C", "torch._C was never reported: no signal"
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 130
    finally:
        proc.kill()
        proc.wait()
    assert rest.strip().splitlines()[-1] == "train.py: error: interrupted before training began"
    assert "Traceback" not in rest


@pytest.mark.parametrize("config", sorted(p.name for p in (Path(__file__).parents[2] / "configs").glob("*.yaml")))
def test_every_shipped_config_is_valid(config):
    """Each configs/*.yaml passes LightningCLI's validation (unknown keys, types) and holds choices the model takes."""
    done = run_script("train.py", "--config", f"configs/{config}", "--print_config", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    model = yaml.safe_load(done.stdout)["model"]
    Mamba2Config(**model["config"]).validate()
    assert model["compile_mode"] in COMPILE_MODES
