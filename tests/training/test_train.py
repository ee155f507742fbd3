"""train.py end to end on the CPU: learning, checkpoints, logging, generation from a checkpoint."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import train
from lightning_modules.checkpoint import load_trained, read_checkpoint
from tests.helpers import read_metrics, script, series, tiny_args, wandb_records

STEP_METRICS = {
    "time/step_ms",
    "time/forward_ms",
    "time/backward_ms",
    "time/optimizer_ms",
    "time/ssd_forward_ms",
    "time/ssd_backward_ms",
    "throughput/tokens_per_s",
}


RUN_WARNINGS: list[warnings.WarningMessage] = []  # every warning finished_run's train.main raised


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, corpus, data_cache):
    """24 steps, validation every 8, a checkpoint every 5: the last one comes from the end of training."""
    root = tmp_path_factory.mktemp("run")
    run = ("--trainer.max_steps=24", "--trainer.val_check_interval=8", "--checkpoint.every_n_train_steps=5")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train.main(tiny_args(root, corpus, *run, cache_dir=data_cache))
    RUN_WARNINGS[:] = caught
    return root


def test_a_run_shows_users_no_future_warning(finished_run):
    """FutureWarning is the deprecation category Python shows users by default: a run raises none (torch >= 2.13
    deprecated the pytree class Lightning 2.6 checks against; train.py hides that one)."""
    assert [str(w.message) for w in RUN_WARNINGS if issubclass(w.category, FutureWarning)] == []


def test_loss_falls_and_artifacts_exist(finished_run):
    rows = read_metrics(finished_run)
    train_loss = series(rows, "train/loss")
    val_loss = series(rows, "val/loss")
    assert len(train_loss) == 24 and len(val_loss) == 3
    first, last = val_loss[min(val_loss)], val_loss[max(val_loss)]
    assert last < first - 0.3, f"validation loss {first:.3f} -> {last:.3f}"
    assert (finished_run / "config.yaml").is_file() and (finished_run / "step_times.json").is_file()
    step_rows = [r for r in rows if "time/step_ms" in r]
    assert STEP_METRICS <= set(step_rows[-1])
    assert all(r["time/ssd_forward_ms"] > 0 and r["time/step_ms"] >= r["time/forward_ms"] for r in step_rows)
    # the time to the first step: logged once, with that step, from the process's start (here pytest's)
    (first,) = [r for r in rows if "time/first_step_s" in r]
    assert first["step"] == 0 and first["time/first_step_s"] >= first["time/step_ms"] / 1e3
    summary = json.loads((finished_run / "step_times.json").read_text())
    assert summary["first_step_s"] == pytest.approx(first["time/first_step_s"], rel=1e-6)
    # the host's time between steps: none before the first; validation (after steps 7 and 15) lands in the gap after
    between = series(rows, "time/between_steps_ms")
    assert sorted(between) == list(range(1, 24)) and min(between.values()) >= 0
    others = sorted(v for step, v in between.items() if step not in (8, 16))
    assert min(between[8], between[16]) > others[len(others) // 2], between


def test_process_age_counts_from_the_process_start():
    """Read from the OS: a new process's age is small and grows with the clock."""
    import subprocess
    import sys

    from lightning_modules.environment import process_age_s

    code = "import time; from lightning_modules.environment import process_age_s as a; x = a(); time.sleep(0.3); print(x, a())"
    young, older = map(
        float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert 0 <= young < 60 and older - young == pytest.approx(0.3, abs=0.1)
    assert process_age_s() > 0  # and in this process too


def test_end_of_training_writes_a_checkpoint_named_after_its_own_loss(finished_run):
    """24 steps with a checkpoint every 5: the last one is step 24 (the end), named with step 24's training loss."""
    checkpoints = finished_run / "checkpoints"
    last = read_checkpoint(checkpoints / "last.ckpt")
    assert last["global_step"] == 24
    loss_24 = series(read_metrics(finished_run), "train/loss")[23]  # logged at step index 23, the 24th step
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", f"step24-loss{loss_24:.3f}.ckpt"]
    step = read_checkpoint(checkpoints / f"step24-loss{loss_24:.3f}.ckpt")
    for k, v in last["state_dict"].items():
        assert torch.equal(v, step["state_dict"][k]), k


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


def _generate(capsys, *args: str) -> str:
    """scripts/generate.py's output for `args`, run in this process; it must succeed."""
    assert script("generate").main(list(args)) == 0
    out, err = capsys.readouterr()
    assert "error" not in err, err[-2000:]
    return out


def test_generate_greedy_matches_the_forward_pass(finished_run, capsys):
    """scripts/generate.py decodes with the recurrent step; greedily it must agree with the chunked forward."""
    ckpt = finished_run / "checkpoints" / "last.ckpt"
    prompt, n = "def function_", 12
    greedy = _generate(capsys, str(ckpt), "--prompt", prompt, "--max_new_tokens", str(n), "--temperature", "0")
    module, tokenizer = load_trained(ckpt)
    ids = tokenizer.encode(prompt).ids
    eos = tokenizer.token_to_id("<|endoftext|>")
    new: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(module.model(torch.tensor([ids + new]))[0, -1].argmax())
            if nxt == eos:
                break
            new.append(nxt)
    assert greedy == prompt + tokenizer.decode(new) + "\n"
    # Sampling: one seed, one text; top_k 1 leaves only the most likely token, so it decodes greedily.
    sample = (str(ckpt), "--prompt", prompt, "--max_new_tokens", str(n))
    first, again = (_generate(capsys, *sample, "--top_k", "5", "--seed", "1") for _ in range(2))
    assert first == again
    assert first.startswith(prompt) and len(first) > len(prompt) + 1  # tokens followed the prompt
    assert _generate(capsys, *sample, "--top_k", "1", "--seed", "2") == greedy
