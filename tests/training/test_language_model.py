"""The LightningModule on the CPU: fused AdamW with gradient clipping under bf16 mixed precision, the
non-finite loss caught without a per-step synchronization and before any checkpoint is written, and
compilation configured once."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_modules.environment import code_fingerprint
from lightning_modules.language_model import LanguageModel, key_compile_caches
from model.mamba2 import Mamba2Config

CONFIG = dict(vocab_size=61, d_model=32, n_layer=2, d_state=8, headdim=16, chunk_size=8, ssd_backend="torch")


def _loader(n: int = 8) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    return DataLoader([{"input_ids": torch.randint(0, 61, (17,), generator=gen)} for _ in range(n)], batch_size=2)


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    defaults = dict(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    return L.Trainer(**(defaults | kwargs))


class GradNorms(Callback):
    """Gradient norms as the optimizer used them (read before the next step zeroes them)."""

    def __init__(self):
        self.norms: list[float] = []

    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:
            self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


def test_fused_adamw_is_clipped_under_bf16_mixed(tmp_path):
    norms = GradNorms()
    module = LanguageModel(config=Mamba2Config(**CONFIG), lr=1e-3)
    trainer = _trainer(tmp_path, precision="bf16-mixed", gradient_clip_val=1e-3, callbacks=[norms], max_steps=4)
    trainer.fit(module, train_dataloaders=_loader())
    assert trainer.optimizers[0].defaults["fused"] is True
    assert len(norms.norms) == 3 and all(n <= 1e-3 * 1.001 for n in norms.norms), norms.norms
    unclipped = GradNorms()
    trainer = _trainer(tmp_path, precision="bf16-mixed", callbacks=[unclipped], max_steps=4)
    trainer.fit(LanguageModel(config=Mamba2Config(**CONFIG), lr=1e-3), train_dataloaders=_loader())
    assert min(unclipped.norms) > 1e-2  # without clipping the norms are far larger: the clip did the work


def test_fp16_with_a_scaler_keeps_adamw_unfused(tmp_path):
    module = LanguageModel(config=Mamba2Config(**CONFIG))
    trainer = _trainer(tmp_path, max_steps=1)
    trainer.fit(module, train_dataloaders=_loader())
    assert trainer.optimizers[0].defaults["fused"] is True  # fp32: nothing scaled, fused
    module.trainer.precision_plugin.scaler = torch.amp.GradScaler("cpu")  # what 16-mixed installs
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is False


def test_non_finite_loss_stops_training_before_a_checkpoint_is_written(tmp_path):
    module = LanguageModel(config=Mamba2Config(**CONFIG))
    with torch.no_grad():
        module.model.norm_f.weight.fill_(float("nan"))
    checkpoints = tmp_path / "ckpt"
    saver = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=1, save_last=True)
    trainer = _trainer(tmp_path, enable_checkpointing=True, callbacks=[saver])
    with pytest.raises(FloatingPointError, match=r"non-finite training loss \(nan\) at step 0"):
        trainer.fit(module, train_dataloaders=_loader())
    assert not checkpoints.exists() or not any(checkpoints.iterdir())


def test_configure_model_compiles_once():
    module = LanguageModel(config=Mamba2Config(**CONFIG), compile=True, compile_mode="max-autotune-no-cudagraphs")
    assert module.model._compiled_call_impl is None
    module.configure_model()
    compiled = module.model._compiled_call_impl
    assert compiled is not None
    module.configure_model()
    assert module.model._compiled_call_impl is compiled
    assert LanguageModel(config=Mamba2Config(**CONFIG)).model._compiled_call_impl is None


def test_compile_caches_keyed_by_the_code():
    # the config's own patch(): monkeypatch would delete the key on undo, which hides it from torch.compile
    with torch.compiler.config.patch(cache_key_tag=""):
        LanguageModel(config=Mamba2Config(**CONFIG), compile=True).configure_model()
        assert torch.compiler.config.cache_key_tag == f"mamba2-cutile-{code_fingerprint()}"
    with torch.compiler.config.patch(cache_key_tag="mine"):  # a key the user set stays
        key_compile_caches()
        assert torch.compiler.config.cache_key_tag == "mine"


def test_training_logs_only_host_values_the_loss_after_the_backward_is_queued(tmp_path, monkeypatch):
    """What training_step and on_before_optimizer_step give self.log: never a Python float (Lightning copies those to
    the device, a wait) nor a tensor of the autograd graph, but host tensors: the lr, and the step's loss as copied
    to the host, logged once its backward has run (before the optimizer step), equal to the loss training_step
    returned, with its perplexity."""
    logged: list[tuple[str, object, int, bool]] = []
    returned: list[torch.Tensor] = []
    original_log, original_step = LanguageModel.log, LanguageModel.training_step

    def log(self, name, value, *args, **kwargs):
        grads = sum(p.grad is not None for p in self.parameters())
        logged.append((name, value, self.global_step, grads > 0))
        return original_log(self, name, value, *args, **kwargs)

    def training_step(self, batch, batch_idx):
        returned.append(loss := original_step(self, batch, batch_idx))
        return loss

    monkeypatch.setattr(LanguageModel, "log", log)
    monkeypatch.setattr(LanguageModel, "training_step", training_step)
    _trainer(tmp_path).fit(LanguageModel(config=Mamba2Config(**CONFIG)), train_dataloaders=_loader())
    assert [name for name, *_ in logged] == ["train/lr", "train/loss", "train/ppl"] * 3
    for name, value, _, _ in logged:
        assert isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.requires_grad, name
    losses = [(value, step, after_backward) for name, value, step, after_backward in logged if name == "train/loss"]
    assert [step for _, step, _ in losses] == [0, 1, 2] and all(after for *_, after in losses)
    assert [float(v) for v, _, _ in losses] == [float(r.detach()) for r in returned]
    ppl = [float(value) for name, value, *_ in logged if name == "train/ppl"]
    assert ppl == pytest.approx([torch.exp(r.detach()).item() for r in returned])
