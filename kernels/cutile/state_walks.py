"""The cuTile backward's two state walks in one launch: the chunk states' recompute (fwd_pass_state's walk) in the
first b·h rows of programs, the states' gradient (bwd_pass_state's walk) in the other b·h.

Each walk has one program per (batch, head, head-dim tile, state tile) walking every chunk in turn: at the seed
shape fewer programs than an H200 has SMs. Launched apart, they run at once only as far as the host launches them
close together and their builds fit an SM together; in eager mode the host is the slower side. In one launch both
walks' programs are queued at once, and at occupancy 2 two programs share an SM. Both halves take the same tile and
occupancy; the forward half takes `chunks_per_step` chunks an iteration. `state_walks`, the cuTile backward's pass,
runs the two walks as its `walks` argument says: by default in this one launch (docs/kernels.md has the timings).
With document boundaries both walks read one seq_idx (HAS_SEQ_IDX) and apply their own stage's masks.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import replace

import cuda.tile as ct
import torch

from kernels.cutile import bwd_pass_state as backward
from kernels.cutile import fwd_pass_state as forward
from kernels.cutile.fwd_pass_state import MANY_PAIRS, StateConfig, search_space, state_grid
from kernels.cutile.launch import (
    ASSUMED_SMS,
    BACKWARD_CHUNK,
    ConstBool,
    ConstInt,
    launch,
    seq_idx_args,
    shape_key,
    sm_count,
    with_hints,
)
from kernels.cutile.signature import Specialization, hinted, kernel_signature, seq_idx_params


@ct.kernel
def state_walks_kernel(
    x, B, dt_out, dA_cumsum, initial_states, chunk_states, final_state,  # fwd_pass_state_kernel's arrays
    dy, C, dA_cumsum_again, dfinal_state, dstates, dinitial_states,  # bwd_pass_state_kernel's
    NHEADS: ConstInt, HEADS_PER_GROUP: ConstInt, Q: ConstInt, TILE_P: ConstInt, TILE_N: ConstInt, HAS_INIT: ConstBool,
    HAS_DFINAL: ConstBool, TF32: ConstBool, LATENCY: ConstInt, STEP: ConstInt,
    seq_idx, HAS_SEQ_IDX: ConstBool,  # both walks' (last: launch.seq_idx_args)
):  # fmt: skip
    pairs = ct.num_blocks(0) // 2  # (batch, head) pairs
    bh = ct.bid(0)
    if bh < pairs:
        forward.forward_walk(
            x, B, dt_out, dA_cumsum, initial_states, chunk_states, final_state, bh, ct.bid(1), ct.bid(2), NHEADS,
            HEADS_PER_GROUP, Q, TILE_P, TILE_N, HAS_INIT, TF32, LATENCY, STEP, seq_idx, HAS_SEQ_IDX,
        )  # fmt: skip
    else:
        backward.backward_walk(
            dy, C, dA_cumsum_again, dfinal_state, dstates, dinitial_states, bh - pairs, ct.bid(1), ct.bid(2), NHEADS,
            HEADS_PER_GROUP, Q, TILE_P, TILE_N, HAS_DFINAL, TF32, LATENCY, seq_idx, HAS_SEQ_IDX,
        )  # fmt: skip


def launch_both(
    arrays: tuple[torch.Tensor, ...], has_init: bool, has_dfinal: bool, seq_idx: torch.Tensor | None
) -> None:
    """Launch state_walks_kernel on `arrays`: forward.walk_arrays' seven, then backward.walk_arrays' six; seq_idx
    (b, l) int32 or None."""
    x, B, dt_out = arrays[:3]
    b, _, h, p = x.shape
    g, n = B.shape[-2:]
    nchunks = arrays[5].shape[1]
    chunk_size = dt_out.shape[-1] // nchunks

    def spec(cfg: StateConfig) -> tuple[tuple[int, ...], object, tuple]:
        grid = state_grid(2 * b * h, p, n, cfg)
        step = forward.walk_step(cfg, nchunks)
        args = (*arrays, h, h // g, chunk_size, cfg.TILE_P, cfg.TILE_N, has_init, has_dfinal)
        args += (x.dtype == torch.float32, cfg.latency, step, *seq_idx_args(seq_idx, dt_out, step * chunk_size))
        return grid, with_hints(state_walks_kernel, cfg.occupancy), args

    key = shape_key(x, B, chunk_size, seq_idx)
    default = default_walks_config(x.dtype, b * h, p, n, sm_count(x.device))
    launch("state_walks", key, default, lambda: search_space(p, n, chunk_size), spec, x.device)


def default_walks_config(
    dtype: torch.dtype, pairs: int, headdim: int, dstate: int, sms: int = ASSUMED_SMS
) -> StateConfig:
    """state_walks' configuration untuned, for `pairs` = batch x heads on a GPU of `sms` SMs. With bf16 inputs, head
    dim at least 64 and state dim at least 128, as tuning chose at the three shapes measured (docs/kernels.md,
    state_walks): from MANY_PAIRS the 32 x 128 tile at occupancy 4, one chunk an iteration (the step at L 2048);
    below, 64 x 32 taking two chunks an iteration, at occupancy 2 where its programs (two walks') fit two an SM (the
    seed, 256 programs) and 4 where they do not (the step at L 8192, 384). StateConfig() otherwise, where nothing
    was measured."""
    if dtype != torch.bfloat16 or headdim < 64 or dstate < 128:
        return StateConfig()
    if pairs >= MANY_PAIRS:
        return StateConfig(TILE_P=32, TILE_N=128, latency=4, occupancy=4, chunks_per_step=1)
    walk = StateConfig(TILE_P=64, TILE_N=32, latency=4, occupancy=2, chunks_per_step=2)
    return walk if math.prod(state_grid(2 * pairs, headdim, dstate, walk)) <= 2 * sms else replace(walk, occupancy=4)


WALK_MODES = ("aside", "one stream", "one launch")
"""How the cuTile backward runs its two walks (`state_walks`' `walks`). Neither needs the other's result, and at the
seed shape each has too few programs to fill the GPU alone.
    "one launch"  both in state_walks_kernel on the current stream: the default, the fastest where each walk alone
                  leaves SMs idle (docs/kernels.md, state_walks).
    "one stream"  fwd_pass_state's and bwd_pass_state's launches on the current stream, one after the other.
    "aside"       the recompute (fwd_pass_state) on a second stream of the device, bwd_pass_state and bwd_dx after it
                  on the current one; the first pass reading the chunk states (bwd_dbc) waits for the second stream
                  (`wait_for_walks`). Ordering of memory: every launch on the second stream is queued after what the
                  current stream holds at that point, and the current stream waits for the second before bwd_dbc, so
                  a buffer either stream frees is reused only after the other's last use of it (no record_stream
                  needed; CUDA graph capture follows the same fork and join). Its gradients equal one stream's bit
                  for bit.
"""
DEFAULT_WALKS = "one launch"
_second_streams: dict[torch.device, torch.cuda.Stream] = {}


def second_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's second stream for the backward's recompute, created on first use."""
    if device not in _second_streams:
        _second_streams[device] = torch.cuda.Stream(device)
    return _second_streams[device]


def state_walks(
    x: torch.Tensor,
    B: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    initial_states: torch.Tensor | None,
    dy: torch.Tensor,
    C: torch.Tensor,
    dfinal_state: torch.Tensor | None,
    seq_idx: torch.Tensor | None = None,
    walks: str = DEFAULT_WALKS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cuTile backward's two walks, run as `walks` (one of WALK_MODES) says. Same contract as
    `kernels.reference_backward.state_walks`; with "aside", call `wait_for_walks` before reading the chunk states.

    Args:
        x, dy: (b, l, h, p).  B, C: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q) float32.
        initial_states, dfinal_state: (b, h, p, n) or None.
        seq_idx: (b, l) int32 document ids, contiguous, non-decreasing along each row, or None.
    Returns:
        chunk_states, final_state, dstates, dinitial_states.
    """
    if walks not in WALK_MODES:
        raise ValueError(f"walks must be one of {', '.join(map(repr, WALK_MODES))}, got {walks!r}")
    if walks == "one launch":
        arrays = forward.walk_arrays(x, B, dt_out, dA_cumsum, initial_states)
        arrays += backward.walk_arrays(dy, C, dA_cumsum, dfinal_state)
        launch_both(arrays, initial_states is not None, dfinal_state is not None, seq_idx)
        return arrays[5], arrays[6], arrays[11], arrays[12]
    stream = contextlib.nullcontext()
    if walks == "aside":
        second = second_stream(x.device)
        second.wait_stream(torch.cuda.current_stream(x.device))
        stream = torch.cuda.stream(second)
    with stream:
        chunk_states, final_state = forward.fwd_pass_state(x, B, dt_out, dA_cumsum, initial_states, seq_idx)
    return chunk_states, final_state, *backward.bwd_pass_state(dy, C, dA_cumsum, dfinal_state, seq_idx)


def wait_for_walks(device: torch.device, walks: str) -> None:
    """With walks "aside": queue what follows on the device's current stream after the recompute on its second
    stream (the chunk states are ready). Nothing for the other modes."""
    if walks == "aside":
        torch.cuda.current_stream(device).wait_stream(second_stream(device))


def aot_signatures() -> Iterator[Specialization]:
    """state_walks_kernel's specializations: both walks in one launch at the backward's chunk size, each default of
    default_walks_config at bf16 (first the one from MANY_PAIRS, the medium step's) and StateConfig() in float32, at
    their occupancy, each without and with seq_idx."""
    chunk = BACKWARD_CHUNK
    bf16 = torch.bfloat16
    defaults = [
        ("bfloat16", default_walks_config(bf16, MANY_PAIRS, 64, 128)),
        ("bfloat16", default_walks_config(bf16, 1, 64, 128)),
        ("bfloat16", default_walks_config(bf16, MANY_PAIRS - 1, 64, 128)),
        ("float32", default_walks_config(torch.float32, MANY_PAIRS, 64, 128)),
    ]
    for has_seq_idx in (False, True):
        for name, cfg in defaults:
            tile_p, tile_n, step = cfg.TILE_P, cfg.TILE_N, cfg.chunks_per_step
            label = f"state_walks[{name},Q={chunk},P={tile_p},N={tile_n},step={step}"
            label += ",seq_idx]" if has_seq_idx else "]"
            yield (
                *hinted(label, state_walks_kernel, cfg.occupancy),
                kernel_signature(
                    forward.walk_signature(name)
                    + backward.walk_signature(name)
                    + [8, 8, chunk, tile_p, tile_n, False, True, name == "float32", cfg.latency, step]
                    + seq_idx_params(has_seq_idx)
                ),
            )
