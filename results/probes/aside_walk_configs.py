"""Which configurations of the backward's two state walks run best side by side. With the recompute on a second
stream (kernels.cutile.state_walks.WALKS "aside"), fwd_pass_state and bwd_pass_state share the GPU, but tuning chose
each one's tiles and occupancy alone: at the L 2048 step layer each then fills the GPU (384 programs) and the two do not
overlap (results/probes/recompute_aside_2026-12-02/). This probe times the cuTile backward alone (ssd_backward with
the cuTile passes), captured in a CUDA graph and replayed, with every configuration of fwd_pass_state's tune space
beside bwd_pass_state's tuned one, then every configuration of bwd_pass_state beside the best of those (one round
of coordinate descent), against the tuned pair on one stream and on two; last, the best pair and the two baselines
re-timed in 5 alternating rounds.

    python scripts/precompile.py --shapes step --modes fwd_bwd --no-triton   # the tune spaces' kernels, in parallel
    python results/probes/aside_walk_configs.py --shapes step,step_l8192 --autotune
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "results" / "probes")]

import bench_kernels  # noqa: E402

from kernels.cutile import ssd, state_walks, tuning  # noqa: E402
from kernels.cutile.fwd_pass_state import StateConfig, search_space  # noqa: E402
from kernels.reference_backward import ssd_backward  # noqa: E402
from lightning_modules.measure.timing import graph_replay, wall_ms  # noqa: E402


def backward_call(shape: bench_kernels.Shape) -> Callable[[], object]:
    """The cuTile backward's passes at `shape` (no forward), as the op runs them."""
    inputs = bench_kernels.make_inputs(shape, "cuda", requires_grad=False)
    x, dt, A, B, C, D, bias = (inputs[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias"))
    dy = torch.randn_like(x)
    chunk = min(shape.chunk_size, ssd.BACKWARD_CHUNK)
    return lambda: ssd_backward(dy, None, x, dt, A, B, C, chunk, D, bias, True, None, passes=ssd.CUTILE)


def replay_ms(call: Callable, aside: bool, fwd: StateConfig | None, bwd: StateConfig | None) -> float:
    """Milliseconds a replay of `call` captured with these walk configurations (None: tuning's), best of 3."""
    state_walks.WALKS = "aside" if aside else "one stream"
    with tuning.forced("fwd_pass_state", fwd), tuning.forced("bwd_pass_state", bwd):
        replay = graph_replay(call)
    return min(wall_ms(replay, 20) for _ in range(3))


def sweep(call: Callable, which: str, space: list[StateConfig], other: StateConfig | None) -> list[tuple]:
    """(ms, config) for each config of `which` walk beside `other` for the other walk, fastest first."""
    timed = []
    for cfg in space:
        fwd, bwd = (cfg, other) if which == "fwd_pass_state" else (other, cfg)
        timed.append((replay_ms(call, True, fwd, bwd), cfg))
    timed.sort(key=lambda t: t[0])
    print(f"  {which}, beside {other or 'the tuned one'}: the 5 fastest of {len(space)}")
    for ms, cfg in timed[:5]:
        print(f"    {ms * 1e3:7.1f} us  {cfg}")
    return timed


def main() -> None:
    default_walks = state_walks.WALKS  # restored at the end
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="step,step_l8192")
    ap.add_argument("--autotune", action="store_true")
    args = ap.parse_args()
    tuning.set_autotune(args.autotune)
    for name in args.shapes.split(","):
        (shape,) = bench_kernels.SHAPE_SETS[name]
        call = backward_call(shape)
        for _ in range(2):  # tune (on one stream) and compile first
            state_walks.WALKS = "one stream"
            call()
        torch.cuda.synchronize()
        print(f"{name} {shape}")
        fwd_space = search_space(shape.headdim, shape.dstate, min(shape.chunk_size, ssd.BACKWARD_CHUNK))
        best_fwd = sweep(call, "fwd_pass_state", fwd_space, None)[0][1]
        best_bwd = sweep(call, "bwd_pass_state", search_space(shape.headdim, shape.dstate), best_fwd)[0][1]
        arms = {
            "tuned, one stream": (False, None, None),
            "tuned, two streams": (True, None, None),
            f"fwd {best_fwd}, bwd {best_bwd}, two streams": (True, best_fwd, best_bwd),
        }
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        for _ in range(5):
            for arm, setting in arms.items():
                times[arm].append(replay_ms(call, *setting))
        for arm, ms in times.items():
            print(
                f"  {statistics.median(ms) * 1e3:7.1f} us [{min(ms) * 1e3:.1f}-{max(ms) * 1e3:.1f}]  {arm}", flush=True
            )
        del call
        torch.cuda.empty_cache()
    state_walks.WALKS = default_walks


if __name__ == "__main__":
    main()
