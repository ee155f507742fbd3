"""The cuTile stages' host functions on a CPU (launches replaced): the defaults they pick per dtype and shape."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_bf16_tuned_defaults_stay_with_bf16_inputs(dtype, monkeypatch):
    """bwd_dx's occupancy 2, its G scaled to log2 units on the host, compute_out's TILE_T 128 and fwd_pass_state's
    two-chunk 64 x 32 walk at occupancy 4 were measured with bf16 inputs only: other dtypes get the earlier forms
    (the host-scaled fp32 bwd_dx hung on the GPU at head dim 64), and tuning never offers float32 inputs bwd_dx at
    occupancy 2 (not measured, and the fp32 kernel sits at the register limit there: 255 registers, 8 bytes of stack
    with D at sm_90). Checked through the host functions, with launch() recording what it gets and the arguments of
    its default's launch."""
    from kernels.cutile import bwd_dx as dx_module
    from kernels.cutile import compute_out as out_module
    from kernels.cutile import fwd_pass_state as state_module

    got = {}

    def record(name, key, default, space, spec, device):
        got[name] = (default, space(), spec(default)[2])
        return default

    monkeypatch.setattr(dx_module, "launch", record)
    monkeypatch.setattr(out_module, "launch", record)
    monkeypatch.setattr(state_module, "launch", record)
    b, l, h, p, g, n, Q = 1, 64, 2, 64, 1, 64, 64
    x, dy = torch.zeros(b, l, h, p, dtype=dtype), torch.zeros(b, l, h, p, dtype=dtype)
    B, C = torch.zeros(b, l, g, n, dtype=dtype), torch.zeros(b, l, g, n, dtype=dtype)
    rows, states = torch.ones(b, h, 1, Q), torch.zeros(b, 1, h, p, n)
    dx_module.bwd_dx(x, dy, B, C, rows, rows, states, torch.zeros(h))
    out_module.compute_out(x, B, C, rows, rows, states, torch.zeros(h))
    state_module.fwd_pass_state(x, B, rows, rows)
    (dx_default, dx_space, dx_args), (out_default, _, _) = got["bwd_dx"], got["compute_out"]
    state_default, state_space, _ = got["fwd_pass_state"]
    bf16 = dtype == torch.bfloat16
    # the kernel's dA_cumsum argument (after dt_out) and its last flag, G_LOG2, before the chunks a program takes and
    # the last chunk's index (then seq_idx's stand-in and HAS_SEQ_IDX)
    assert dx_args[-5] is bf16 and dx_args[-4:-2] == (dx_default.chunks, 0)
    assert torch.equal(dx_args[5], rows.view(b, h, Q) * (dx_module.LOG2E if bf16 else 1.0))
    # given the log2 copy (the SSD's backward: chunk_cumsum_log2 wrote it), bf16 takes it as it is, no host multiply
    log2 = torch.full((b, h, 1, Q), 3.0)
    dx_module.bwd_dx(x, dy, B, C, rows, rows, states, torch.zeros(h), dA_log2=log2)
    assert got["bwd_dx"][2][5].data_ptr() == (log2 if bf16 else rows).data_ptr()
    assert dx_default.occupancy == (2 if bf16 else 1)
    assert out_default.TILE_T == (128 if bf16 else 64) and out_default.blocks == (2 if bf16 else 1)
    assert any(c.occupancy == 2 for c in dx_space) == (dtype != torch.float32)
    two_chunk_walk = state_module.StateConfig(TILE_P=64, TILE_N=32, latency=4, occupancy=4, chunks_per_step=2)
    assert state_default == (two_chunk_walk if bf16 else state_module.StateConfig())
    assert state_default in state_space  # a default tuning can also pick
    # chunks of 256 (two-chunk walks spill there) and head dims below 64 keep the one-chunk default
    for head_dim, chunk in ((64, 256), (32, 128)):
        assert state_module.default_state_config(dtype, head_dim, 128, chunk) == state_module.StateConfig()


@pytest.mark.parametrize(
    ("dtype", "batch", "heads", "forward", "walks"),
    [  # (TILE_P, TILE_N, occupancy, chunks_per_step): tuning's choices at these shapes on an H100 (docs/kernels.md)
        (torch.bfloat16, 8, 24, (64, 32, 4, 1), (32, 128, 4, 1)),  # the medium step at L 2048: 192 pairs
        (torch.bfloat16, 2, 24, (64, 32, 2, 2), (64, 32, 4, 2)),  # the step at L 8192: 48
        (torch.bfloat16, 4, 8, (64, 32, 4, 2), (64, 32, 2, 2)),  # the seed: 32
        (torch.float32, 8, 24, None, None),  # not measured: StateConfig()
    ],
    ids=["l2048", "l8192", "seed", "float32"],
)
def test_state_walk_defaults_follow_the_pairs_of_batch_and_heads(dtype, batch, heads, forward, walks, monkeypatch):
    """Untuned, fwd_pass_state and state_walks launch the configuration tuning chose at shapes of as many (batch,
    head) pairs and programs per SM (an H100's 132 SMs off a GPU); each launch's grid and STEP follow it."""
    from kernels.cutile import fwd_pass_state as forward_module
    from kernels.cutile import state_walks as walks_module
    from kernels.cutile.fwd_pass_state import StateConfig

    got = {}

    def record(name, key, default, space, spec, device):
        got[name] = (default, space(), spec(default))

    monkeypatch.setattr(forward_module, "launch", record)
    monkeypatch.setattr(walks_module, "launch", record)
    l, p, n = 256, 64, 128
    x, B = torch.zeros(batch, l, heads, p, dtype=dtype), torch.zeros(batch, l, 1, n, dtype=dtype)
    forward_module.fwd_pass_state(x, B, torch.zeros(batch, heads, 2, 128), torch.zeros(batch, heads, 2, 128))
    rows = torch.zeros(batch, heads, 4, 64)
    walks_module.state_walks(x, B, rows, rows, None, x, B, None)
    for name, expected, halves in (("fwd_pass_state", forward, 1), ("state_walks", walks, 2)):
        default, space, (grid, _, args) = got[name]
        if expected is None:
            assert default == StateConfig()
        else:
            assert (default.TILE_P, default.TILE_N, default.occupancy, default.chunks_per_step) == expected
        assert default in space  # a default tuning can also pick
        assert grid == (halves * batch * heads, p // default.TILE_P, n // default.TILE_N)
        assert args[-3] == default.chunks_per_step  # the kernel's STEP (before seq_idx and HAS_SEQ_IDX)


def test_the_forward_walk_takes_one_or_two_chunks_an_iteration(monkeypatch):
    """fwd_pass_state's kernel forms one or two chunks' products an iteration; a configuration asking for more (a
    forced one, or a cache written by other code) is refused with its name, not run as a wrong walk."""
    from kernels.cutile import fwd_pass_state as state_module
    from kernels.cutile.fwd_pass_state import StateConfig

    specs = {}

    def record(name, key, default, space, spec, device):
        specs.update({k: spec(StateConfig(64, 32, 4, 2, k)) for k in (1, 2)})
        spec(StateConfig(64, 32, 4, 2, 3))

    monkeypatch.setattr(state_module, "launch", record)
    b, l, h, p, n, Q = 1, 256, 2, 64, 32, 64
    x, B, rows = torch.zeros(b, l, h, p), torch.zeros(b, l, 1, n), torch.zeros(b, h, l // Q, Q)
    with pytest.raises(ValueError, match="fwd_pass_state walks 1 or 2 chunks an iteration, not 3"):
        state_module.fwd_pass_state(x, B, rows, rows)
    assert [specs[k][2][-3] for k in (1, 2)] == [1, 2]  # the kernel's STEP (before seq_idx and HAS_SEQ_IDX)


def test_every_ssd_launch_takes_seq_idx_last(monkeypatch):
    """The cuTile SSD forward and backward with their launches recorded on CPU tensors: every stage that masks by
    document (all but chunk_cumsum and chunk_cumsum_bwd) gets seq_idx and HAS_SEQ_IDX True as its last two arguments
    and tunes under the shape's key suffixed "_seq_idx"; without seq_idx, a float32 array stands in, HAS_SEQ_IDX is
    False and the key is the shape's own (the shipped table's keys)."""
    import contextlib

    import cuda.tile as ct

    from kernels.cutile import launch as launch_module
    from kernels.cutile import ssd as cutile_ssd
    from kernels.cutile import tuning

    launched: dict[str, tuple] = {}
    keys: dict[str, str] = {}

    def choose(name, key, default, space, device, spec):
        keys[name] = key
        return default

    def launch(stream, grid, kernel, args, **options):
        launched[kernel._pyfunc.__name__.removesuffix("_kernel")] = args

    monkeypatch.setattr(ct, "launch", launch)
    monkeypatch.setattr(tuning, "choose", choose)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(launch_module, "raw_stream", lambda device: 0)
    monkeypatch.setattr(cutile_ssd, "check_inputs", lambda tensors, chunk_size: None)
    b, l, h, p, g, n, Q = 2, 100, 2, 16, 1, 16, 64
    x, dy, B, C = torch.randn(b, l, h, p), torch.randn(b, l, h, p), torch.randn(b, l, g, n), torch.randn(b, l, g, n)
    dt, A = torch.rand(b, l, h), -torch.rand(h)
    masked = {"fwd_pass_state", "compute_out", "state_walks", "bwd_dx", "bwd_dbc"}
    shape = f"b{b}_l{l}_h{h}_p{p}_g{g}_n{n}"
    documents = (torch.arange(l, dtype=torch.int32) // 30).expand(b, l).contiguous()  # four, the last one short
    for seq_idx in (None, documents):
        launched.clear()
        cutile_ssd.ssd_forward(x, dt, A, B, C, 128, None, None, True, None, seq_idx, "cutile")
        cutile_ssd.ssd_backward(dy, None, x, dt, A, B, C, 128, seq_idx=seq_idx)
        assert set(launched) == masked | {"chunk_cumsum", "chunk_cumsum_bwd"}
        for name in masked:
            ids, has_seq_idx = launched[name][-2:]
            chunk = 128 if name in ("fwd_pass_state", "compute_out") else Q
            if seq_idx is None:
                assert has_seq_idx is False and ids.dtype == torch.float32, name
                assert keys[name] == f"{shape}_Q{chunk}_float32", name
            else:
                # l 100 is no multiple of a chunk: a copy padded with each row's last id to whole chunks
                assert has_seq_idx is True and ids.shape == (b, 128) and torch.equal(ids[:, :l], seq_idx), name
                assert (ids[:, l:] == 3).all(), name
                assert keys[name] == f"{shape}_Q{chunk}_float32_seq_idx", name
        for name in ("chunk_cumsum", "chunk_cumsum_bwd"):
            assert not any(arg is seq_idx for arg in launched[name]) and not keys[name].endswith("_seq_idx"), name
    for walks in ("one stream", "aside"):  # the two walks launched apart take it too
        launched.clear()
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
        monkeypatch.setattr(torch.cuda, "Stream", lambda device: _Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        cutile_ssd.ssd_backward(dy, None, x, dt, A, B, C, 64, seq_idx=seq_idx, walks=walks)
        for name in ("fwd_pass_state", "bwd_pass_state"):
            ids, has_seq_idx = launched[name][-2:]
            assert has_seq_idx is True and ids.shape == (b, 128) and torch.equal(ids[:, :l], seq_idx), (walks, name)


class _Stream:
    """A stand-in for a CUDA stream: waits are no operation."""

    def wait_stream(self, other: _Stream) -> None:
        pass


def test_each_masking_kernel_declares_specializations_with_and_without_seq_idx():
    """Every SSD kernel that masks by document declares specializations with seq_idx (so CI compiles the masks) and
    without; their last two parameters are seq_idx and HAS_SEQ_IDX, as the host functions pass them: an int32 (b, l)
    array and True, or the float32 (b, h, c·Q) rows standing in and False."""
    import cuda.tile as ct
    from cuda.tile import compilation as ctc

    from bench import aot

    masking = {"fwd_pass_state", "compute_out", "bwd_pass_state", "state_walks", "bwd_dx", "bwd_dbc"}
    seen: dict[str, set[bool]] = {stage: set() for stage in masking}
    for label, _, signature in aot.every_signature():
        stage = label.split("[")[0]
        if stage not in masking:
            continue
        ids, flag = signature.parameters[-2:]
        assert isinstance(ids, ctc.ArrayConstraint) and isinstance(flag, ctc.ConstantConstraint), label
        assert flag.value == ("seq_idx" in label), label
        assert (ids.dtype, ids.ndim) == ((ct.int32, 2) if flag.value else (ct.float32, 3)), label
        seen[stage].add(flag.value)
    assert all(flags == {False, True} for flags in seen.values()), seen


@pytest.mark.parametrize("l", [128, 100, 37], ids=["whole_chunks", "padded", "one_padded_chunk"])
def test_last_document_dt_keeps_dt_on_each_chunks_last_document(l):
    """bwd_dbc's weight of dB's state term (the kernel loads it: a mask built in the kernel spilled): dt where a
    token's document is the one its chunk ends in, the chunk's last real token's when the row is padded, else 0;
    checked token by token against that rule, and a boundary moved by one token changes it."""
    from kernels.cutile.bwd_dbc import last_document_dt

    b, h, Q = 2, 3, 32
    c = -(-l // Q)
    gen = torch.Generator().manual_seed(0)
    seq_idx = torch.cumsum((torch.rand(b, l, generator=gen) < 0.1).int(), dim=1, dtype=torch.int32)
    dt = torch.rand(b, h, c, Q, generator=gen) + 0.5
    got = last_document_dt(dt, seq_idx)
    want = torch.zeros_like(dt)
    for bi in range(b):
        for ci in range(c):
            last = seq_idx[bi, min(ci * Q + Q - 1, l - 1)]
            for t in range(Q):
                if seq_idx[bi, min(ci * Q + t, l - 1)] == last:
                    want[bi, :, ci, t] = dt[bi, :, ci, t]
    assert torch.equal(got, want)
    assert 0 < int((got == 0).sum()) < got.numel()  # both kinds of token occur
    moved = seq_idx.clone()
    edge = int(torch.nonzero(seq_idx[0, 1:Q] != seq_idx[0, : Q - 1])[-1]) + 1  # chunk 0's last document starts here
    moved[0, edge] = moved[0, edge - 1]
    assert not torch.equal(last_document_dt(dt, moved), got)
