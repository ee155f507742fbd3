"""Bad input ends in one line naming the problem and the fix (exit code 2), never in a traceback, and a
checkpoint is never opened in a way that could run code it holds."""

from __future__ import annotations

import os

import pytest
import torch

import train
from lightning_modules.checkpoint import read_checkpoint
from tests.helpers import ROOT, run_script, tiny_args

pytestmark = pytest.mark.slow


class RunsCode:
    """Unpickling this runs a shell command: what a booby-trapped checkpoint would hold."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("trained")
    train.main(
        tiny_args(root, corpus, "--trainer.max_steps=2", "--checkpoint.every_n_train_steps=2", "--logging.wandb=false")
    )
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


def test_bad_configuration_is_one_line(tmp_path, corpus, capsys):
    assert "d_modle" in _fails_in_one_line(capsys, tiny_args(tmp_path, corpus, "--model.config.d_modle=64"))
    line = _fails_in_one_line(capsys, tiny_args(tmp_path, corpus, "--trainer.max_steps=many"))
    assert "trainer.max_steps" in line and "many" in line
    assert "nope.yaml" in _fails_in_one_line(capsys, ["--config", str(tmp_path / "nope.yaml")])
    line = _fails_in_one_line(capsys, tiny_args(tmp_path, corpus, "--model.config.ssd_backend=fastest"))
    assert "ssd_backend must be one of" in line
    line = _fails_in_one_line(
        capsys, tiny_args(tmp_path / "b", corpus, "--model.config.ssd_backend=cutile", "--logging.wandb=false")
    )
    assert "cutile" in line and "cannot run here" in line


def test_bad_paths_are_one_line(tmp_path, corpus, capsys):
    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "a", tmp_path / "no/such/corpus", "--logging.wandb=false"))
    assert "no/such/corpus" in line and "does not exist" in line
    missing = tmp_path / "missing.ckpt"
    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "b", corpus, f"--ckpt_path={missing}"))
    assert str(missing) in line and "does not exist" in line


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


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, corpus, checkpoint, capsys):
    marker = tmp_path / "code-ran"
    trapped = read_checkpoint(checkpoint)
    trapped["hyper_parameters"]["extra"] = RunsCode(f"touch {marker}")
    path = tmp_path / "trapped.ckpt"
    torch.save(trapped, path)

    line = _fails_in_one_line(capsys, tiny_args(tmp_path / "run", corpus, f"--ckpt_path={path}"))
    assert "refusing to open" in line and "system" in line
    done = run_script("scripts/generate.py", str(path))
    assert done.returncode == 2 and "refusing to open" in done.stderr.strip().splitlines()[-1]
    assert "weights_only" not in done.stderr and "Traceback" not in done.stderr
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


def test_generate_errors_are_one_line(tmp_path):
    for path, expected in ((tmp_path / "missing.ckpt", "does not exist"), (ROOT / "README.md", "is not a checkpoint")):
        done = run_script("scripts/generate.py", str(path))
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert expected in done.stderr.strip().splitlines()[-1]


def test_generate_refuses_bad_sampling_settings_before_reading_the_checkpoint(tmp_path):
    """--top_k 0 once ended in an IndexError; each bad setting is named in one line, and the checkpoint (here
    missing) is not read first."""
    for flag, value in (("--top_k", "0"), ("--top_k", "-3"), ("--temperature", "-0.5"), ("--temperature", "nan")):
        done = run_script("scripts/generate.py", str(tmp_path / "missing.ckpt"), flag, value)
        assert done.returncode == 2 and done.stdout == "", (flag, value, done.stderr[-2000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"generate.py: error: {flag} must be"), lines
