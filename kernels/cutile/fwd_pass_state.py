"""Stage 2 of the SSD forward in cuTile: the state entering every chunk, and the final state.

Reference: `kernels.reference.fwd_pass_state`, whose contract the host function `fwd_pass_state` keeps.
One program per (batch, head, head-dim tile, state tile) walks the chunks in order and jumps over each chunk in
one step: the old state decays by exp(G_end) and one ct.mma adds all Q tokens,
    state = exp(G_end) * state + xᵀ (B * exp(G_end - G) * dt)        (TILE_P, Q) @ (Q, TILE_N).
Sequential steps: number of chunks, not number of tokens.

An iteration of the walk takes STEP chunks (1 or 2, the configuration's `chunks_per_step`): one load of their STEP·Q
tokens, the chunks stepped over in turn, and one store of the STEP states entering them (in chunk_states' dtype;
with one chunk before its step, with two after both). Two chunks an iteration halve the loads and stores issued,
which made the walk faster at the seed's shape (docs/kernels.md, fwd_pass_state). A walk with an odd number of
chunks ends in a chunk past the end: its loads pad with zeros (dt 0, so
the state passes it unchanged) and its store falls outside chunk_states, where cuTile drops it, except in a walk of
one chunk: a (1, 2, ...) store is not clipped at c = 1 (cuTile writes the next head's state), so the host takes one
chunk an iteration there.

In a two-chunk walk each chunk's product is formed from a zero accumulator, so it waits on no state, and the state
then takes one multiply-add; both chunks' products of an iteration are formed before either is added. This was
faster at the seed's shape than the product accumulating onto the decayed state (docs/kernels.md, fwd_pass_state):
the gain came in the occupancy-4 build, whose deeper load pipeline the old form could not use. A one-chunk walk
still accumulates onto the decayed state: formed from zero, its product sits beside the state and spills.

With bf16 inputs chunk_states is stored in bf16, as mamba_ssm's state passing stores the states in the
inputs' dtype: it halves the largest tensor this stage writes and compute_out and bwd_dbc read. The recurrence
stays fp32 in registers (only the stored copy is rounded) and final_state stays float32. fp32 and fp16 inputs
keep float32 chunk_states (fp16's range is too narrow for states). compute_out's bf16 product rounded the
state to bf16 already, so the forward's y is the same either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import cuda.tile as ct
import torch
from cuda.tile.compilation import ArrayConstraint

from kernels.cutile.launch import (
    ASSUMED_SMS,
    ZERO,
    ConstBool,
    ConstInt,
    launch,
    seq_idx_args,
    shape_key,
    sm_count,
    with_hints,
)
from kernels.cutile.signature import (
    DTYPES,
    Specialization,
    array,
    cutile_dtype,
    hinted,
    kernel_signature,
    seq_idx_params,
)


@ct.function
def documents(seq_idx, bi, tile, T):
    """Row bi's document ids of tokens tile·T … tile·T + T − 1, (1, T) int32: a tile load of seq_idx (b, l′) int32,
    l′ a multiple of T (launch.seq_idx_args pads a row to it), so the tile lies inside the row. A load, not a gather:
    pipelined with the loop's other loads, where a gather stalled every chunk of the walks (docs/kernels.md,
    boundaries). A device function, inlined into the kernels that take seq_idx."""
    return ct.load(seq_idx, index=(bi, tile), shape=(1, T), latency=2)


@ct.function
def document_before(seq_idx, bi, tile, T):
    """Row bi's document id of the token before tile `tile` of T tokens, (1, 1) int32: the previous tile's last
    token's, and 0 for tile 0 (the initial state belongs to document 0). Loads that previous tile (tile 0 again for
    tile 0) as `documents` does. A device function, inlined."""
    previous = documents(seq_idx, bi, ct.maximum(tile - 1, 0), T)
    return ct.extract(previous, index=(0, T - 1), shape=(1, 1)) * ct.minimum(tile, 1)


@ct.function
def within(value, keep, HAS_SEQ_IDX):
    """`value` where the bool tile `keep` holds and 0 elsewhere, with HAS_SEQ_IDX; without, `value` as it is (`keep`
    unused), so the expression builds as it did before the mask. A device function, inlined."""
    if HAS_SEQ_IDX:
        return ct.where(keep, value, 0.0)
    return value


@ct.function
def store_states(chunk_states, entering, bi, j, hi, pj, nj):
    """Store `entering` (STEP, TILE_P, TILE_N), the states entering chunks STEP·j on, rounded to chunk_states' dtype
    (the state carried on stays fp32). A device function: inlined into the kernel calling it."""
    step, tile_p, tile_n = entering.shape
    tile = entering.astype(chunk_states.dtype).reshape((1, step, 1, tile_p, tile_n))
    ct.store(chunk_states, index=(bi, j, hi, pj, nj), tile=tile)


@ct.function
def walk_product(rows, weights, acc, TF32):
    """acc + rowsᵀ weights, rows (Q, TILE_P) in the inputs' dtype, weights (Q, TILE_N) fp32, acc (TILE_P, TILE_N)
    fp32: the product's operands in rows' dtype (bf16/fp16) or, with TF32 (fp32 inputs), in TF32; accumulation in
    fp32. A device function inlined into both walks' kernels."""
    if TF32:
        return ct.mma(ct.transpose(rows.astype(ct.tfloat32)), weights.astype(ct.tfloat32), acc)
    return ct.mma(ct.transpose(rows), weights.astype(rows.dtype), acc)


@ct.function
def chunk_product(gs, ds, xs, bs, s, Q, TF32, carried, ONTO, docs, before, HAS_SEQ_IDX):
    """Chunk s of an iteration's tiles, gs and ds (STEP·Q, 1) fp32, xs (STEP·Q, TILE_P), bs (STEP·Q, TILE_N) ->
    (x_sᵀ (B_s * exp(G_end - G) * dt), G_end, kept): the chunk's tokens' whole contribution to the state leaving it,
    (TILE_P, TILE_N) fp32, accumulated from zero, or with ONTO onto exp(G_end) * carried (the state leaving the
    chunk); its last cumulative log decay, (1, 1); and, with HAS_SEQ_IDX, whether the state entering it is carried
    through it (kept, (1, 1) bool; None without). With HAS_SEQ_IDX, docs (STEP·Q, 1) int32 are the tokens'
    document ids (`documents`) and before (1, 1) the previous chunk's last one: only tokens of the chunk's last
    document add, and the state entering it is kept only if the chunk ends in `before`'s document. Natural-log units
    with ct.exp: scaling g by log2(e) for exp2 made the walk slower (docs/kernels.md, fwd_pass_state). A device
    function, inlined."""
    g = ct.extract(gs, index=(s, 0), shape=(Q, 1))
    d = ct.extract(ds, index=(s, 0), shape=(Q, 1))
    xk = ct.extract(xs, index=(s, 0), shape=(Q, xs.shape[1]))
    bk = ct.extract(bs, index=(s, 0), shape=(Q, bs.shape[1]))
    g_end = ct.extract(g, index=(Q - 1, 0), shape=(1, 1))
    to_last, kept = None, None  # with seq_idx: the tokens of the chunk's last document (Q, 1), and kept
    if HAS_SEQ_IDX:
        doc = ct.extract(docs, index=(s, 0), shape=(Q, 1))
        last = ct.extract(doc, index=(Q - 1, 0), shape=(1, 1))
        to_last, kept = doc == last, last == before
    # B scaled by each token's decay to the chunk end
    weights = bk.astype(ct.float32) * within(ct.exp(g_end - g) * d, to_last, HAS_SEQ_IDX)
    if ONTO:
        acc = carried * within(ct.exp(g_end), kept, HAS_SEQ_IDX)
    else:
        acc = ct.zeros((xs.shape[1], bs.shape[1]), dtype=ct.float32)
    return walk_product(xk, weights, acc, TF32), g_end, kept


@ct.function
def forward_walk(
    x, B, dt_out, dA_cumsum, initial_states, chunk_states, final_state, bh, pj, nj, NHEADS, HEADS_PER_GROUP, Q, TILE_P,
    TILE_N, HAS_INIT, TF32, LATENCY, STEP, seq_idx, HAS_SEQ_IDX,
):  # fmt: skip
    """The walk of program (bh: batch·head, pj: head-dim tile, nj: state tile) over every chunk, the kernel's
    arguments as fwd_pass_state_kernel takes them. A device function: fwd_pass_state_kernel's body, and the forward
    half of kernels.cutile.state_walks' launch."""
    bi = bh // NHEADS
    hi = bh % NHEADS
    gi = hi // HEADS_PER_GROUP
    if HAS_INIT:
        state = ct.load(
            initial_states, index=(bi, hi, pj, nj), shape=(1, 1, TILE_P, TILE_N), padding_mode=ZERO
        ).reshape((TILE_P, TILE_N))
    else:
        state = ct.zeros((TILE_P, TILE_N), dtype=ct.float32)
    nchunks = chunk_states.shape[1]
    tokens = STEP * Q
    for j in range(ct.cdiv(nchunks, STEP)):
        gs = ct.load(dA_cumsum, index=(bi, hi, j), shape=(1, 1, tokens), padding_mode=ZERO, latency=2)
        ds = ct.load(dt_out, index=(bi, hi, j), shape=(1, 1, tokens), padding_mode=ZERO, latency=2)
        xs = ct.load(x, index=(bi, j, hi, pj), shape=(1, tokens, 1, TILE_P), padding_mode=ZERO, latency=LATENCY)
        bs = ct.load(B, index=(bi, j, gi, nj), shape=(1, tokens, 1, TILE_N), padding_mode=ZERO, latency=LATENCY)
        gs, ds = gs.reshape((tokens, 1)), ds.reshape((tokens, 1))
        xs, bs = xs.reshape((tokens, TILE_P)), bs.reshape((tokens, TILE_N))
        docs, before, middle = None, None, None  # document ids: this iteration's tokens', the ones before its chunks
        if HAS_SEQ_IDX:
            docs = documents(seq_idx, bi, j, tokens).reshape((tokens, 1))
            before = document_before(seq_idx, bi, j, tokens)
            middle = ct.extract(docs, index=(Q - 1, 0), shape=(1, 1))  # the first chunk's last (with STEP 2)
        entering = state.reshape((1, TILE_P, TILE_N))  # the states entering this iteration's chunks, in order
        if STEP == 1:
            # stored before the step, and the product accumulating onto the decayed state: held across the step, or
            # beside a product formed from zero, the state spills at 64 registers a thread (a 32 x 128 tile at
            # occupancy 4; docs/kernels.md, fwd_pass_state)
            store_states(chunk_states, entering, bi, j, hi, pj, nj)
            state, _, _ = chunk_product(gs, ds, xs, bs, 0, Q, TF32, state, True, docs, before, HAS_SEQ_IDX)
        else:
            # both chunks' products first, each from zero: they wait on no state, and the carried state then takes
            # one multiply-add a chunk (docs/kernels.md, fwd_pass_state)
            product0, g_end0, kept0 = chunk_product(gs, ds, xs, bs, 0, Q, TF32, state, False, docs, before, HAS_SEQ_IDX)
            product1, g_end1, kept1 = chunk_product(gs, ds, xs, bs, 1, Q, TF32, state, False, docs, middle, HAS_SEQ_IDX)
            state = state * within(ct.exp(g_end0), kept0, HAS_SEQ_IDX) + product0
            entering = ct.cat((entering, state.reshape((1, TILE_P, TILE_N))), 0)
            state = state * within(ct.exp(g_end1), kept1, HAS_SEQ_IDX) + product1
            store_states(chunk_states, entering, bi, j, hi, pj, nj)
    ct.store(final_state, index=(bi, hi, pj, nj), tile=state.reshape((1, 1, TILE_P, TILE_N)))


@ct.kernel
def fwd_pass_state_kernel(
    x,  # (b, l, h, p)
    B,  # (b, l, g, n)
    dt_out,  # (b, h, c * Q) float32
    dA_cumsum,  # (b, h, c * Q) float32
    initial_states,  # (b, h, p, n) float32 (ignored unless HAS_INIT)
    chunk_states,  # (b, c, h, p, n) bfloat16 (bf16 inputs) or float32, written
    final_state,  # (b, h, p, n) float32, written
    NHEADS: ConstInt,
    HEADS_PER_GROUP: ConstInt,
    Q: ConstInt,
    TILE_P: ConstInt,
    TILE_N: ConstInt,
    HAS_INIT: ConstBool,
    TF32: ConstBool,
    LATENCY: ConstInt,
    STEP: ConstInt,
    seq_idx,  # (b, l) int32 document ids (ignored unless HAS_SEQ_IDX; last: launch.seq_idx_args)
    HAS_SEQ_IDX: ConstBool,
):
    forward_walk(
        x, B, dt_out, dA_cumsum, initial_states, chunk_states, final_state, ct.bid(0), ct.bid(1), ct.bid(2), NHEADS,
        HEADS_PER_GROUP, Q, TILE_P, TILE_N, HAS_INIT, TF32, LATENCY, STEP, seq_idx, HAS_SEQ_IDX,
    )  # fmt: skip


def states_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype chunk states and their gradients are stored in with `dtype` inputs: bf16 for bf16, else float32."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


@dataclass(frozen=True)
class StateConfig:
    """Block sizes and occupancy of one fwd_pass_state (or bwd_pass_state) launch."""

    TILE_P: int = 32
    TILE_N: int = 64
    latency: int = 4
    occupancy: int = 2
    chunks_per_step: int = 1  # fwd_pass_state's STEP; bwd_pass_state steps one chunk an iteration


def state_grid(rows: int, headdim: int, dstate: int, cfg: StateConfig) -> tuple[int, int, int]:
    """A state walk's grid: `rows` ((batch, head) pairs, per walk) x cfg's head-dim x state-dim tiles."""
    return rows, -(-headdim // cfg.TILE_P), -(-dstate // cfg.TILE_N)


# (batch, head) pairs from which the state walks take their one-chunk tile: tuning chose it at 192 pairs (the medium
# step at L 2048) and two-chunk walks at 32 and 48 (the seed, the step at L 8192); the threshold lies between, unmeasured
MANY_PAIRS = 96


def default_state_config(
    dtype: torch.dtype, headdim: int, dstate: int, chunk_size: int, pairs: int = 1, sms: int = ASSUMED_SMS
) -> StateConfig:
    """fwd_pass_state's configuration untuned, for `pairs` = batch x heads on a GPU of `sms` SMs. With bf16 inputs,
    head dim at least 64, state dim at least 32 and chunks of at most 128 tokens, the 64 x 32 tile, as tuning chose
    at the three shapes measured (docs/kernels.md, fwd_pass_state): from MANY_PAIRS one chunk an iteration at
    occupancy 4 (the step at L 2048); below, two chunks an iteration, at occupancy 4 where the programs are no more
    than the SMs (the seed, 128 programs) and 2 where they are more (the step at L 8192, 192). StateConfig()
    otherwise, where nothing was measured."""
    if dtype != torch.bfloat16 or headdim < 64 or dstate < 32 or chunk_size > 128:
        return StateConfig()
    if pairs >= MANY_PAIRS:
        return StateConfig(TILE_P=64, TILE_N=32, latency=4, occupancy=4, chunks_per_step=1)
    walk = StateConfig(TILE_P=64, TILE_N=32, latency=4, occupancy=4, chunks_per_step=2)
    return walk if math.prod(state_grid(pairs, headdim, dstate, walk)) <= sms else replace(walk, occupancy=2)


def search_space(headdim: int, dstate: int, chunk_size: int | None = None) -> list[StateConfig]:
    """Configurations worth timing for this head dim and state dim; given fwd_pass_state's `chunk_size`, also walks
    taking two chunks an iteration where it is at most 128 (at 256 their builds spill), for the tiles of at most
    2048 elements at occupancy 2 and 4 that were probed (docs/kernels.md, fwd_pass_state). bwd_pass_state passes no
    chunk size: its walk takes one chunk an iteration."""
    two_chunk_steps = chunk_size is not None and chunk_size <= 128
    space = []
    for tp in (16, 32, 64):
        for tn in (32, 64, 128):
            if tp > max(16, headdim) or tn > max(32, dstate):
                continue
            for occ in (1, 2, 4):
                space.append(StateConfig(tp, tn, 4, occ))
                if two_chunk_steps and tp * tn <= 2048 and occ > 1:
                    space.append(StateConfig(tp, tn, 4, occ, 2))
    return space


def states_array(name: str) -> ArrayConstraint:
    """The array argument of the chunk states or their gradients, (b, c, h, p, n), with inputs of dtype `name` (a key
    of kernels.cutile.signature.DTYPES): stored in states_dtype's."""
    return array(cutile_dtype(states_dtype(getattr(torch, name))), 5)


def aot_signatures() -> Iterator[Specialization]:
    """The specializations CI compiles, in every dtype: first the seed shape's default (default_state_config with
    bf16 inputs: the 64 x 32 tile, two chunks an iteration at occupancy 4), then chunks of 64, 128 and 256, with
    and without initial states, one and two chunks an iteration, at StateConfig()'s occupancy; then with seq_idx:
    the bf16 default, a one-chunk walk with initial states, and float32's."""
    cases = [
        (name, chunk, tile_p, tile_n, has_init, step, occupancy, False)
        for name in DTYPES
        for chunk, tile_p, tile_n, has_init, step, occupancy in (
            (128, 64, 32, False, 2, 4),
            (64, 64, 64, True, 1, StateConfig().occupancy),
            (64, 64, 32, True, 2, StateConfig().occupancy),
            (128, 32, 64, False, 2, StateConfig().occupancy),
            (256, 16, 128, True, 1, StateConfig().occupancy),
        )
    ]
    cases += [  # the other bf16 defaults: many (batch, head) pairs, and more programs than SMs
        ("bfloat16", 128, 64, 32, False, 1, 4, False),
        ("bfloat16", 128, 64, 32, False, 2, 2, False),
        ("bfloat16", 128, 64, 32, False, 2, 4, True),
        ("bfloat16", 64, 32, 128, True, 1, 4, True),
        ("float32", 64, 32, 64, True, 2, StateConfig().occupancy, True),
    ]
    for name, chunk, tile_p, tile_n, has_init, step, occupancy, has_seq_idx in cases:
        label = f"fwd_pass_state[{name},Q={chunk},P={tile_p},N={tile_n},init={has_init},step={step}"
        label += ",seq_idx]" if has_seq_idx else "]"
        yield (
            *hinted(label, fwd_pass_state_kernel, occupancy),
            kernel_signature(
                walk_signature(name)
                + [8, 8, chunk, tile_p, tile_n, has_init, name == "float32", 4, step, *seq_idx_params(has_seq_idx)]
            ),
        )


def walk_signature(name: str) -> list:
    """The forward walk's seven array arguments (`walk_arrays`) with inputs of dtype `name`."""
    dtype, f32 = DTYPES[name], ct.float32
    inputs = [array(dtype, 4), array(dtype, 4), array(f32, 3), array(f32, 3), array(f32, 4)]
    return inputs + [states_array(name), array(f32, 4)]


def fwd_pass_state(
    x: torch.Tensor,
    B: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2 on the GPU. Same contract as `kernels.reference.fwd_pass_state`.

    Args:
        x: (b, l, h, p).  B: (b, l, g, n).  dt_out, dA_cumsum: (b, h, c, Q) float32 from `chunk_cumsum`.
        initial_states: (b, h, p, n) or None.
        seq_idx: (b, l) int32 document ids, contiguous, non-decreasing along each row, or None.
    Returns:
        chunk_states: (b, c, h, p, n), the state entering each chunk: bfloat16 when x is bfloat16, else float32.
        final_state: (b, h, p, n) float32.
    """
    b, _, h, p = x.shape
    g, n = B.shape[-2:]
    _, _, nchunks, chunk_size = dt_out.shape
    arrays = walk_arrays(x, B, dt_out, dA_cumsum, initial_states)

    def spec(cfg: StateConfig) -> tuple[tuple[int, ...], object, tuple]:
        grid = state_grid(b * h, p, n, cfg)
        args = (*arrays, h, h // g, chunk_size, cfg.TILE_P, cfg.TILE_N, initial_states is not None)
        step = walk_step(cfg, nchunks)
        args += (x.dtype == torch.float32, cfg.latency, step, *seq_idx_args(seq_idx, arrays[2], step * chunk_size))
        return grid, with_hints(fwd_pass_state_kernel, cfg.occupancy), args

    key = shape_key(x, B, chunk_size, seq_idx)
    default = default_state_config(x.dtype, p, n, chunk_size, b * h, sm_count(x.device))
    launch("fwd_pass_state", key, default, lambda: search_space(p, n, chunk_size), spec, x.device)
    return arrays[5], arrays[6]


def walk_arrays(
    x: torch.Tensor,
    B: torch.Tensor,
    dt_out: torch.Tensor,
    dA_cumsum: torch.Tensor,
    initial_states: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """The forward walk's seven array arguments, as forward_walk takes them: x, B, dt_out and dA_cumsum (as rows),
    the initial states (float32; final_state stands in when there are none), and its outputs, chunk_states (b, c, h,
    p, n) in states_dtype(x.dtype) and final_state (b, h, p, n) float32, allocated."""
    b, _, h, p = x.shape
    n = B.shape[-1]
    _, _, nchunks, chunk_size = dt_out.shape
    chunk_states = torch.empty((b, nchunks, h, p, n), device=x.device, dtype=states_dtype(x.dtype))
    final_state = torch.empty((b, h, p, n), device=x.device, dtype=torch.float32)
    init = final_state if initial_states is None else initial_states.to(torch.float32).contiguous()
    rows = (b, h, nchunks * chunk_size)
    return x, B, dt_out.view(rows), dA_cumsum.view(rows), init, chunk_states, final_state


def walk_step(cfg: StateConfig, nchunks: int) -> int:
    """The forward walk's STEP for `cfg` over `nchunks` chunks: its chunks_per_step, 1 or 2 (else ValueError), and 1
    for a walk of one chunk (a (1, 2, ...) store would not be clipped at c = 1: cuTile then writes the next head's
    state)."""
    if cfg.chunks_per_step not in (1, 2):
        raise ValueError(f"fwd_pass_state walks 1 or 2 chunks an iteration, not {cfg.chunks_per_step} ({cfg})")
    return min(cfg.chunks_per_step, nchunks)
