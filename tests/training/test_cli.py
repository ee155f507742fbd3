"""train.py's command line: its help, the keys it refuses, a run that diverges, Ctrl-C while the libraries load,
and the shipped configs. Configuration errors (exit 2, one line, nothing written): tests/training/test_errors.py."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import yaml

import train
from lightning_modules.language_model import COMPILE_MODES
from model.mamba2 import Mamba2Config
from tests.helpers import ROOT, default_sigint, tiny_args
from tests.training.test_errors import _fails_in_one_line


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


def test_a_diverged_run_says_so_and_claims_no_checkpoint(tmp_path, corpus, data_cache, capsys):
    diverging = ("--model.lr=100", "--model.warmup_steps=1", "--trainer.max_steps=20")
    args = tiny_args(tmp_path, corpus, *diverging, cache_dir=data_cache)
    line = _fails_in_one_line(capsys, [*args, "--logging.wandb=false"], code=1)
    assert "diverged" in line and "No checkpoint was written yet." in line
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_ctrl_c_while_the_libraries_load_ends_in_one_line(tmp_path):
    """SIGINT in the middle of `import torch` (python -X importtime reports each finished import on stderr,
    so the signal is sent once a module inside torch has loaded and before torch itself has)."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "train.py", "--config", "configs/tiny.yaml", "--trainer.max_steps", "1"]
        + ["--trainer.default_root_dir", str(tmp_path), "--logging.wandb", "false"],
        cwd=ROOT,
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


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_shipped_config_is_valid(config, capsys):
    """Each configs/*.yaml passes LightningCLI's validation (unknown keys, types), holds choices the model takes,
    and tunes the cuTile kernels only on request."""
    with pytest.raises(SystemExit) as done:
        train.main(["--config", str(ROOT / "configs" / config), "--print_config"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err[-2000:]
    model = yaml.safe_load(out)["model"]
    Mamba2Config(**model["config"]).validate()
    assert model["compile_mode"] in COMPILE_MODES
    assert model["cutile_autotune"] is False
