"""The Mamba-2 language model: shapes, initialisation, the recurrent step, config errors."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_modules.model.mamba2 import Mamba2Config, Mamba2LM

CFG = dict(vocab_size=97, d_model=32, n_layer=2, d_state=8, headdim=16, ngroups=2, chunk_size=8)


def test_shapes_and_tied_head():
    model = Mamba2LM(Mamba2Config(**CFG))
    tokens = torch.randint(0, 97, (3, 21))
    logits = model(tokens)
    assert logits.shape == (3, 21, 97)
    # The LM head is the embedding: no other (vocab, d_model) parameter, and the logits move with it.
    assert [n for n, p in model.named_parameters() if p.shape == (97, 32)] == ["embedding.weight"]
    with torch.no_grad():
        model.embedding.weight[5] += 1.0
        assert not torch.allclose(model(tokens)[..., 5], logits[..., 5])


def test_causal():
    model = Mamba2LM(Mamba2Config(**CFG)).eval()
    tokens = torch.randint(0, 97, (1, 20))
    changed = tokens.clone()
    changed[0, 15] = (changed[0, 15] + 1) % 97
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :15], b[:, :15])
    assert not torch.allclose(a[:, 15:], b[:, 15:])


def test_mamba2_initialisation():
    cfg = Mamba2Config(**CFG)
    model = Mamba2LM(cfg)
    for layer in model.layers:
        assert torch.equal(layer.D, torch.ones(cfg.nheads))
        A = torch.exp(layer.A_log)
        assert ((A >= 1.0) & (A <= 16.0)).all()
        dt = torch.nn.functional.softplus(layer.dt_bias)
        assert ((dt >= cfg.dt_init_floor * 0.999) & (dt <= cfg.dt_max * 1.001)).all()
        assert all(getattr(p, "_no_weight_decay", False) for p in (layer.A_log, layer.D, layer.dt_bias))


def test_step_by_step_equals_full_forward():
    """Generation's recurrent step (constant state per token) computes what the chunked forward does."""
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(**CFG)).double().eval()
    tokens = torch.randint(0, 97, (2, 19))
    with torch.no_grad():
        full = model(tokens)
        cache = model.allocate_cache(2, tokens.device, torch.float64)
        for c in cache:
            c["ssm"] = c["ssm"].double()
        steps = torch.stack([model.step(tokens[:, t], cache) for t in range(19)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-9, atol=1e-9)
    assert cache[0]["ssm"].shape == (2, 4, 16, 8) and cache[0]["conv"].shape[-1] == 4


def test_initial_loss_is_near_uniform():
    model = Mamba2LM(Mamba2Config(**CFG))
    tokens = torch.randint(0, 97, (4, 32))
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, 97), tokens[:, 1:].reshape(-1))
    assert abs(loss.item() - math.log(97)) < 0.5


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(headdim=12), "divisible by headdim"),
        (dict(ngroups=3), "divisible by ngroups"),
        (dict(n_layer=0), "n_layer must be positive"),
    ],
)
def test_bad_configs(change, message):
    with pytest.raises(ValueError, match=message):
        Mamba2LM(Mamba2Config(**{**CFG, **change}))
