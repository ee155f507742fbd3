"""train.py end to end on the CPU: learning, checkpoints, resuming, logging, bad input, generation."""

from __future__ import annotations

import pytest
import torch

import train
from scripts import generate
from tests.helpers import read_metrics, series, tiny_args, wandb_records, write_corpus

pytestmark = pytest.mark.slow

STEP_METRICS = {
    "time/step_ms",
    "time/forward_ms",
    "time/backward_ms",
    "time/optimizer_ms",
    "time/ssd_forward_ms",
    "time/ssd_backward_ms",
    "throughput/tokens_per_s",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_files=16)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("run")
    train.main(tiny_args(root, corpus, "--trainer.max_steps=24", "--trainer.val_check_interval=8"))
    return root


def test_loss_falls_and_artifacts_exist(finished_run):
    rows = read_metrics(finished_run)
    train_loss = series(rows, "train/loss")
    val_loss = series(rows, "val/loss")
    assert len(train_loss) == 24 and len(val_loss) == 3
    first, last = val_loss[min(val_loss)], val_loss[max(val_loss)]
    assert last < first - 0.3, f"validation loss {first:.3f} -> {last:.3f}"
    assert (finished_run / "checkpoints" / "last.ckpt").is_file()
    assert (finished_run / "config.yaml").is_file() and (finished_run / "step_times.json").is_file()
    step_rows = [r for r in rows if "time/step_ms" in r]
    assert STEP_METRICS <= set(step_rows[-1])
    assert all(r["time/ssd_forward_ms"] > 0 and r["time/step_ms"] >= r["time/forward_ms"] for r in step_rows)


def test_offline_wandb_run_holds_the_step_time_metrics(finished_run):
    from wandb.proto import wandb_internal_pb2 as pb

    files = list((finished_run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, "expected one offline wandb run"
    history_keys, config_keys = set(), set()
    for data in wandb_records(files[0]):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history_keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
        elif kind == "config":
            config_keys |= {item.key for item in record.config.update}
    assert STEP_METRICS | {"train/loss", "val/loss"} <= history_keys
    assert {"ssd_backend_used", "versions", "config", "lr"} <= config_keys


def test_interrupted_run_resumes_with_the_same_losses(tmp_path, corpus):
    reference = tmp_path / "uninterrupted"
    train.main(tiny_args(reference, corpus, "--logging.wandb=false"))
    expected = series(read_metrics(reference), "train/loss")

    crashed = tmp_path / "crashed"
    crash = ["--trainer.callbacks+=tests.helpers.InterruptAt", "--trainer.callbacks.step=10", "--logging.wandb=false"]
    with pytest.raises(RuntimeError, match="simulated crash at step 10"):
        train.main(tiny_args(crashed, corpus, *crash))
    # The failure lost nothing: the last checkpoint (step 8) and the log up to the crash are there.
    assert (crashed / "checkpoints" / "last.ckpt").is_file()
    before = series(read_metrics(crashed, version=0), "train/loss")
    assert max(before) == 9

    train.main(tiny_args(crashed, corpus, "--ckpt_path=last", "--logging.wandb=false"))
    resumed = series(read_metrics(crashed, version=1), "train/loss")
    assert sorted(resumed) == list(range(8, 12))
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], rel=1e-5), f"step {step}"


def test_unknown_key_is_rejected(tmp_path, corpus, capsys):
    with pytest.raises(SystemExit):
        train.main(tiny_args(tmp_path, corpus, "--model.config.d_modle=64"))
    assert "d_modle" in capsys.readouterr().err


def test_bad_backend_and_bad_corpus_are_named(tmp_path, corpus):
    with pytest.raises(ValueError, match="ssd_backend must be one of"):
        train.main(tiny_args(tmp_path / "a", corpus, "--model.config.ssd_backend=fastest"))
    with pytest.raises(RuntimeError, match="SSD backend 'cutile' cannot run here"):
        train.main(tiny_args(tmp_path / "b", corpus, "--model.config.ssd_backend=cutile", "--logging.wandb=false"))
    with pytest.raises(FileNotFoundError, match="no/such/corpus"):
        train.main(tiny_args(tmp_path / "c", "no/such/corpus", "--logging.wandb=false"))


def test_generate_from_checkpoint(finished_run):
    model, tokenizer = generate.load(finished_run / "checkpoints" / "last.ckpt")
    prompt = tokenizer.encode("def function_").ids
    greedy = generate.generate(model, prompt, 12, temperature=0)
    assert len(greedy) == 12
    # Greedy recurrent decoding agrees with the chunked forward's argmax on the same prefix.
    with torch.no_grad():
        logits = model(torch.tensor([prompt + greedy[:-1]]))
    assert logits[0, len(prompt) - 1 :].argmax(-1).tolist() == greedy
    sampled = generate.generate(model, prompt, 8, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(0))
    assert 0 < len(sampled) <= 8


def test_generate_cli_prints_text(finished_run, capsys):
    generate.main([str(finished_run / "checkpoints" / "last.ckpt"), "--prompt", "def ", "--max_new_tokens", "5"])
    assert capsys.readouterr().out.startswith("def ")
    with pytest.raises(FileNotFoundError, match=r"missing\.ckpt"):
        generate.main([str(finished_run / "missing.ckpt")])
