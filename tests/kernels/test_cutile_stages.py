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
    # the last chunk's index
    assert dx_args[-3] is bf16 and dx_args[-2:] == (dx_default.chunks, 0)
    assert torch.equal(dx_args[5], rows.view(b, h, Q) * (dx_module.LOG2E if bf16 else 1.0))
    # given the log2 copy (the SSD's backward: chunk_cumsum_log2 wrote it), bf16 takes it as it is, no host multiply
    log2 = torch.full((b, h, 1, Q), 3.0)
    dx_module.bwd_dx(x, dy, B, C, rows, rows, states, torch.zeros(h), log2)
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
    assert [specs[k][2][-1] for k in (1, 2)] == [1, 2]  # the kernel's STEP
