"""Bad input ends in one line naming the problem and the fix (exit code 2), never in a traceback; a configuration
that cannot run is refused before anything is written (no run folder, wandb run, CSV log or data cache), and a
checkpoint is never opened in a way that could run code it holds."""

from __future__ import annotations

import os
import runpy
import sys

import pytest
import torch

import train
from lightning_modules.checkpoint import read_checkpoint
from tests.helpers import ROOT, script, tiny_args


class RunsCode:
    """Unpickling this runs a shell command: what a booby-trapped checkpoint would hold."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, corpus, data_cache):
    root = tmp_path_factory.mktemp("trained")
    args = ("--trainer.max_steps=2", "--checkpoint.every_n_train_steps=2", "--logging.wandb=false")
    train.main(tiny_args(root, corpus, *args, cache_dir=data_cache))
    return root / "checkpoints" / "last.ckpt"


def _fails_in_one_line(capsys, args: list[str], code: int = 2) -> str:
    """Run train.py in-process on `args`; it must exit with `code` after one error line. Returns that line."""
    with pytest.raises(SystemExit) as failed:
        train.main(args)
    assert failed.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "weights_only" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("train.py: error: ")
    return last


def _generate_fails_in_one_line(capsys, args: list[str]) -> str:
    """scripts/generate.py's main in-process: it must return 2 after one error line, printing nothing else."""
    assert script("generate").main(args) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("generate.py: error: "), (out, lines)
    return lines[0]


# What cannot run, refused before anything is written: the arguments ({tmp}: the test's own folder), and what
# the one line says. Each run has wandb on and its data cache under its root, so that both would show.
REFUSED = {
    "ssd_backend cutile": (["--model.config.ssd_backend=cutile"], "ssd_backend 'cutile' cannot run here"),
    "ssd_backend triton": (["--model.config.ssd_backend=triton"], "ssd_backend 'triton' cannot run here"),
    "unknown ssd_backend": (["--model.config.ssd_backend=fastest"], "ssd_backend must be one of"),
    "the bench's standin": (["--model.config.ssd_backend=standin"], "ssd_backend 'standin' replaces the SSD"),
    "cutile backward, auto": (["--model.config.ssd_backward=cutile"], "ssd_backward 'cutile' needs the cutile backend"),
    "cutile backward, torch": (
        ["--model.config.ssd_backward=cutile", "--model.config.ssd_backend=torch"],
        "ssd_backward 'cutile' needs the cutile backend",
    ),
    "conv_backend cutile": (["--model.config.conv_backend=cutile"], "conv_backend cutile cannot run here"),
    "norm_backend cutile": (["--model.config.norm_backend=cutile"], "norm_backend cutile cannot run here"),
    "unknown conv": (["--model.config.conv_backend=triton"], "conv_backend must be one of auto, torch, cutile"),
    "headdim": (["--model.config.headdim=24"], "expand * d_model = 64 must be divisible by headdim = 24"),
    "chunk_size": (["--model.config.chunk_size=0"], "model.config: chunk_size must be positive, got 0"),
    "ngroups": (["--model.config.ngroups=0"], "model.config: ngroups must be positive"),
    "compile_mode": (["--model.compile_mode=fast"], "model.compile_mode must be one of"),
    "batch_size": (["--data.batch_size=0"], "data.batch_size must be positive, got 0"),
    "seq_len": (["--data.seq_len=0"], "data.seq_len must be positive, got 0"),
    "vocab": (["--data.vocab_size=100"], "data.vocab_size must be at least 257 (256 bytes + EOS), got 100"),
    "corpus": (["--data.corpus={tmp}/no/such/corpus"], "no/such/corpus' does not exist"),
    "accelerator": (["--trainer.accelerator=gpu"], "No supported gpu backend found"),
    "unknown key": (["--model.config.d_modle=64"], "d_modle"),
    "wrong type": (["--trainer.max_steps=many"], "trainer.max_steps"),
    "missing checkpoint": (["--ckpt_path={tmp}/missing.ckpt"], "missing.ckpt' does not exist"),
    "last without a checkpoint": (["--ckpt_path=last"], "no checkpoint to resume"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_configuration_that_cannot_run_is_refused_before_anything_is_written(case, tmp_path, corpus, capsys):
    arguments, says = REFUSED[case]
    root = tmp_path / "run"
    root.mkdir()  # the run's folder, as a user's earlier run leaves it: empty here, and empty afterwards
    line = _fails_in_one_line(capsys, tiny_args(root, corpus, *(a.format(tmp=tmp_path) for a in arguments)))
    assert says.format(tmp=tmp_path) in line
    assert sorted(p.name for p in root.iterdir()) == [], "no run folder, wandb run, CSV log or data cache"
    if case.endswith(("cutile", "triton")) and not case.startswith("unknown"):  # a backend that cannot run here
        key = case.split()[0]
        assert f"model.config.{key}" in line and f"use {key} " in line  # the key, and the way out


def test_a_config_file_that_is_not_there_is_named(tmp_path, capsys):
    assert "nope.yaml" in _fails_in_one_line(capsys, ["--config", str(tmp_path / "nope.yaml")])


def test_debug_flag_keeps_the_traceback(tmp_path, corpus):
    with pytest.raises(ValueError, match="ssd_backend must be one of"):
        train.main(tiny_args(tmp_path, corpus, "--model.config.ssd_backend=fastest", "--debug"))


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path, corpus, checkpoint, capsys):
    noise = tmp_path / "noise.ckpt"
    noise.write_bytes(os.urandom(4096))
    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "a", corpus, f"--ckpt_path={noise}"))
    assert "noise.ckpt" in line and "is not a checkpoint" in line
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(checkpoint.read_bytes()[:2000])
    assert "is not a checkpoint" in _fails_in_one_line(capsys, tiny_args(tmp_path / "b", corpus, f"--ckpt_path={cut}"))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, corpus, checkpoint, capsys, monkeypatch):
    marker = tmp_path / "code-ran"
    trapped = read_checkpoint(checkpoint)
    trapped["hyper_parameters"]["extra"] = RunsCode(f"touch {marker}")
    path = tmp_path / "trapped.ckpt"
    torch.save(trapped, path)

    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "run", corpus, f"--ckpt_path={path}"))
    assert "refusing to open" in line and "system" in line
    monkeypatch.setattr(sys, "argv", ["generate.py", str(path)])
    with pytest.raises(SystemExit) as done:  # the script as a user runs it, its exit status included
        runpy.run_path(str(ROOT / "scripts" / "generate.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert done.value.code == 2 and "refusing to open" in err.strip().splitlines()[-1]
    assert "weights_only" not in err and "Traceback" not in err
    assert not marker.exists(), "loading the checkpoint ran the code it holds"


def test_a_checkpoint_of_another_model_size_is_refused(tmp_path, corpus, checkpoint, capsys):
    line = _fails_in_one_line(
        capsys, tiny_args(tmp_path, corpus, "--model.config.d_model=64", f"--ckpt_path={checkpoint}")
    )
    assert "holds another model" in line and "d_model" in line and "drop --ckpt_path" in line
    assert not (tmp_path / "csv").exists(), "nothing may run before the checkpoint is checked"


def test_a_checkpoint_of_another_tokenizer_is_refused(tmp_path, checkpoint, capsys):
    other = tmp_path / "other-corpus"
    other.mkdir()
    for i in range(16):
        (other / f"notes_{i}.txt").write_text(" ".join(f"word{i * j % 97} and more prose" for j in range(300)))
    line = _fails_in_one_line(capsys, tiny_args(tmp_path, other, f"--ckpt_path={checkpoint}", "--logging.wandb=false"))
    assert "another tokenizer" in line and "drop --ckpt_path" in line


def test_generate_errors_are_one_line(tmp_path, capsys):
    for path, expected in ((tmp_path / "missing.ckpt", "does not exist"), (ROOT / "README.md", "is not a checkpoint")):
        assert expected in _generate_fails_in_one_line(capsys, [str(path)])


def test_generate_refuses_bad_sampling_settings_before_reading_the_checkpoint(tmp_path, capsys):
    """--top_k 0 once ended in an IndexError; each bad setting is named in one line, and the checkpoint (here
    missing) is not read first."""
    for flag, value in (("--top_k", "0"), ("--top_k", "-3"), ("--temperature", "-0.5"), ("--temperature", "nan")):
        line = _generate_fails_in_one_line(capsys, [str(tmp_path / "missing.ckpt"), flag, value])
        assert line.startswith(f"generate.py: error: {flag} must be"), (flag, value, line)
