"""The Mamba-2 language model: shapes, initialisation, the recurrent step, config errors; the fused step
against the plain statement of the same model (values, gradients, a loss curve), compiled as one graph."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.reference import ssd_chunked
from model import mamba2
from model.layers import causal_conv1d_silu
from model.mamba2 import Mamba2Config, Mamba2LM, layer_backend, next_token_loss

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
        low, high = cfg.A_init_range
        assert ((A >= low * 0.999) & (A <= high * 1.001)).all()
        dt = torch.nn.functional.softplus(layer.dt_bias)  # log-uniform in [dt_min, dt_max]
        assert ((dt >= cfg.dt_min * 0.999) & (dt <= cfg.dt_max * 1.001)).all()
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
    cfg = Mamba2Config(**CFG)
    assert cache[0]["ssm"].shape == (2, cfg.nheads, cfg.headdim, cfg.d_state)
    assert cache[0]["conv"].shape[-1] == cfg.d_conv


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
        (dict(ngroups=0), "ngroups must be positive"),
        (dict(headdim=0), "headdim must be positive"),
        (dict(ssd_backend="fastest"), "ssd_backend must be one of auto, torch, cutile, triton, standin"),
        (dict(ssd_backward="fast"), "ssd_backward must be one of reference, cutile"),
        (
            dict(ssd_backward="cutile", ssd_backend="torch"),
            "ssd_backward 'cutile' needs the cutile backend, got .*'torch'",
        ),
        (dict(ssd_backward="cutile", ssd_backend="auto"), r"got ssd_backend 'auto' \(auto runs torch where cuTile"),
    ],
)
def test_bad_configs(change, message):
    with pytest.raises(ValueError, match=message):
        Mamba2LM(Mamba2Config(**{**CFG, **change}))


# -- the fused step against the plain statement of the same model ------------------------------------
def plain_loss(model: Mamba2LM, tokens: torch.Tensor) -> torch.Tensor:
    """The model's math written plainly, as this project first wrote it, on the model's own parameters:
    one in_proj matmul then split, nn.functional.conv1d on channels-first activations, the RMSNorm
    formula, the reference SSD, all logits at once and F.cross_entropy."""
    cfg = model.cfg
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    b, l = inputs.shape
    gn = cfg.ngroups * cfg.d_state

    def norm(x, weight, z=None, group_size=None):
        v = x * F.silu(z) if z is not None else x
        groups = v.reshape(*v.shape[:-1], -1, group_size or v.shape[-1])
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)
        return groups.reshape(v.shape) * weight

    h = F.embedding(inputs, model.embedding.weight)
    for pre_norm, layer in zip(model.norms, model.layers):
        z, xbc, dt = F.linear(norm(h, pre_norm.weight), layer.in_proj.weight).split(
            [cfg.d_inner, layer.conv_dim, cfg.nheads], dim=-1
        )
        conv = F.conv1d(
            xbc.transpose(1, 2), layer.conv1d.weight, layer.conv1d.bias, padding=cfg.d_conv - 1, groups=layer.conv_dim
        )
        x, B, C = F.silu(conv[..., :l].transpose(1, 2)).split([cfg.d_inner, gn, gn], dim=-1)
        y, _ = ssd_chunked(
            x.reshape(b, l, cfg.nheads, cfg.headdim),
            dt,
            -torch.exp(layer.A_log.float()),  # as the model: A in float32
            B.reshape(b, l, cfg.ngroups, cfg.d_state),
            C.reshape(b, l, cfg.ngroups, cfg.d_state),
            cfg.chunk_size,
            D=layer.D,
            dt_bias=layer.dt_bias,
            dt_softplus=True,
        )
        gated = norm(y.reshape(b, l, cfg.d_inner), layer.norm.weight, z, cfg.d_inner // cfg.ngroups)
        h = h + F.linear(gated, layer.out_proj.weight)
    logits = F.linear(norm(h, model.norm_f.weight), model.embedding.weight)
    return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))


FUSED = dict(CFG, ssd_backend="torch", loss_chunk=16)  # 3 x 20 tokens: chunks of 16 do not divide them


def test_fused_model_equals_plain_statement_in_float64():
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(**FUSED)).double()
    tokens = torch.randint(0, 97, (3, 21))
    loss = next_token_loss(model, tokens)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    ref = plain_loss(model, tokens)
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_loss_curve_equals_plain_statement(dtype, tolerance):
    """20 AdamW steps from the same weights on the same batches: the fused model and the plain statement
    trace the same loss curve, to `tolerance` (absolute, in nats) at every step."""
    torch.manual_seed(0)
    fused = Mamba2LM(Mamba2Config(**FUSED)).to(dtype)
    plain = copy.deepcopy(fused)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 97, (3, 21), generator=gen) for _ in range(4)]
    curves = {}
    for name, model, loss_fn in (("fused", fused, next_token_loss), ("plain", plain, plain_loss)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        curve = []
        for step in range(20):
            opt.zero_grad()
            loss = loss_fn(model, batches[step % 4])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            curve.append(loss.item())
        curves[name] = curve
    assert curves["fused"][-1] < curves["fused"][0] - 0.5  # it learns: the curves are not flat
    assert max(abs(a - b) for a, b in zip(curves["fused"], curves["plain"])) < tolerance


def test_compiled_model_is_one_graph_with_the_same_loss_and_gradients():
    """fullgraph=True fails on any graph break; the compiled loss and gradients equal the eager ones."""
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(**FUSED))
    tokens = torch.randint(0, 97, (3, 21))
    loss = next_token_loss(model, tokens)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager_decomp_partition")
    c_loss = next_token_loss(compiled, tokens)
    c_grads = torch.autograd.grad(c_loss, list(model.parameters()))
    torch.testing.assert_close(c_loss, loss)
    for g, r in zip(c_grads, grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_auto_layers_run_torch_where_cutile_cannot_and_stay_one_graph():
    """conv_backend and norm_backend "auto" on the CPU: the torch layers, the same loss bit for bit, and the
    choice is a constant of the compiled graph (fullgraph=True fails on a graph break)."""
    assert layer_backend("auto", torch.device("cpu")) == "torch"
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(**FUSED, conv_backend="auto", norm_backend="auto"))
    ref = Mamba2LM(Mamba2Config(**FUSED))
    ref.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 97, (3, 21))
    loss = next_token_loss(model, tokens)
    assert torch.equal(loss, next_token_loss(ref, tokens))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager_decomp_partition")
    torch.testing.assert_close(next_token_loss(compiled, tokens), loss)


def test_auto_layers_call_the_cutile_kernels_where_cutile_runs(monkeypatch):
    """Where kernels.cutile_runs says yes for the inputs' device, "auto" calls the cuTile conv and norm (here
    stand-ins that record their calls and compute the torch layers)."""
    calls = []

    def conv(x, weight, bias, sizes, seq_idx=None):
        calls.append("conv")
        return causal_conv1d_silu(x, weight, bias, seq_idx).split(sizes, dim=-1)

    def norm(x, weight, eps, z=None, group_size=None):
        calls.append("norm")
        return mamba2.rms_norm(x, weight, eps, z, group_size)

    monkeypatch.setattr(kernels, "cutile_runs", lambda device_type, device_index=None: device_type == "cpu")
    monkeypatch.setattr(mamba2, "_cutile_conv", lambda: conv)
    monkeypatch.setattr(mamba2, "_cutile_norm", lambda: norm)
    assert (
        layer_backend("auto", torch.device("cpu")) == "cutile"
        and layer_backend("torch", torch.device("cpu")) == "torch"
    )
    for layers, expected in (({}, []), ({"conv_backend": "auto", "norm_backend": "auto"}, ["conv", "norm"] * 2)):
        calls.clear()
        model = Mamba2LM(Mamba2Config(**FUSED, **layers))  # two layers
        next_token_loss(model, torch.randint(0, 97, (2, 9)))
        assert calls == expected


def test_loss_equals_cross_entropy_of_the_logits_and_the_standin_backend_replaces_the_ssd():
    """The loss is the cross-entropy of the logits; with ssd_backend "standin" (y = x·D, for the step benchmark)
    the same weights give other logits, and the step's gradients reach D but not A_log."""
    torch.manual_seed(0)
    cfg = Mamba2Config(**FUSED)
    model = Mamba2LM(cfg)
    tokens = torch.randint(0, 97, (2, 15))
    logits = model(tokens[:, :-1])
    torch.testing.assert_close(
        next_token_loss(model, tokens), F.cross_entropy(logits.reshape(-1, 97), tokens[:, 1:].reshape(-1))
    )
    torch.manual_seed(0)
    other = Mamba2LM(dataclasses.replace(cfg, ssd_backend="standin"))
    assert not torch.allclose(other(tokens), model(tokens))
    next_token_loss(other, tokens).backward()
    block = other.layers[0]
    assert block.D.grad is not None and block.A_log.grad is None


def test_packed_documents_are_modelled_as_if_alone():
    """With seq_idx, each document of a packed row gets the logits it gets alone (conv windows and SSD states
    restart at every boundary, in every layer); without it the later documents read the earlier ones."""
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(**CFG)).eval()
    lengths = [1, 11, 8, 13]  # a one-token document, one crossing a chunk edge, one exactly a chunk, a longer one
    docs = [torch.randint(0, 97, (1, n)) for n in lengths]
    packed = torch.cat(docs, dim=1)
    seq_idx = torch.cat([torch.full((1, n), i, dtype=torch.int32) for i, n in enumerate(lengths)], dim=1)
    with torch.no_grad():
        logits = model(packed, seq_idx=seq_idx)
        alone = torch.cat([model(d) for d in docs], dim=1)
        leaky = model(packed)
    torch.testing.assert_close(logits, alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(leaky[:, lengths[0] :], alone[:, lengths[0] :], atol=1e-3)
    shifted = seq_idx.clone()
    shifted[0, 12] = 1  # the third document's first token moved into the second: its logits change
    with torch.no_grad():
        assert not torch.allclose(model(packed, seq_idx=shifted), alone, atol=1e-3)


# -- checkpoint_layers: each block recomputed in the backward -----------------------------------------
DOCUMENTS = torch.tensor([[0] * 3 + [1] * 9 + [2] * 8], dtype=torch.int32).expand(3, -1)  # 20 inputs, 3 documents


def plain_and_checkpointed() -> tuple[Mamba2LM, Mamba2LM]:
    """FUSED's model (seed 0) and the same weights with checkpoint_layers."""
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(**FUSED))
    checkpointed = Mamba2LM(Mamba2Config(**FUSED, checkpoint_layers=True))
    checkpointed.load_state_dict(model.state_dict())
    return model, checkpointed


@pytest.mark.parametrize("seq_idx", [None, DOCUMENTS], ids=["one-document", "three-documents"])
def test_checkpointed_layers_give_the_same_loss_and_gradients(seq_idx):
    model, checkpointed = plain_and_checkpointed()
    tokens = torch.randint(0, 97, (3, 21))
    results = []
    for m in (model, checkpointed):
        loss = next_token_loss(m, tokens, seq_idx)
        results.append((loss, torch.autograd.grad(loss, list(m.parameters()))))
    (loss, grads), (c_loss, c_grads) = results
    torch.testing.assert_close(c_loss, loss, rtol=1e-6, atol=1e-6)
    for (name, _), g, r in zip(model.named_parameters(), c_grads, grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7, msg=name)


def test_checkpoint_layers_without_grad_run_the_plain_forward(monkeypatch):
    """Under no_grad nothing is kept for a backward, so nothing is checkpointed: the same logits, no checkpoint call."""
    model, checkpointed = plain_and_checkpointed()
    tokens = torch.randint(0, 97, (2, 15))

    def refuse(*args, **kwargs):
        raise AssertionError("torch.utils.checkpoint.checkpoint called under no_grad")

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", refuse)
    with torch.no_grad():
        assert torch.equal(checkpointed(tokens), model(tokens))
    with pytest.raises(AssertionError, match="called under no_grad"):  # with grad it is what runs the blocks
        checkpointed(tokens)


def test_checkpointed_layers_compile_as_one_graph_with_the_same_loss_and_gradients():
    """LanguageModel compiles with fullgraph=True: the checkpointed blocks trace without a graph break, and the
    compiled loss and gradients equal the eager ones."""
    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(**FUSED, checkpoint_layers=True))
    tokens = torch.randint(0, 97, (3, 21))
    loss = next_token_loss(model, tokens, DOCUMENTS)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager_decomp_partition")
    c_loss = next_token_loss(compiled, tokens, DOCUMENTS)
    c_grads = torch.autograd.grad(c_loss, list(model.parameters()))
    torch.testing.assert_close(c_loss, loss)
    for g, r in zip(c_grads, grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
