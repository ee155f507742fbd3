"""The cuTile backward at chunk 128 against chunk 64 (kernels.cutile.ssd.BACKWARD_CHUNK), at the seed shape, in one
process. At chunk 64 the backward writes and reads twice the chunk states and state gradients it would at 128 (at the
seed 335 MB more of HBM traffic across the walks, bwd_dx and bwd_dbc: kernels/cutile/traffic.py); at 128 the
production bwd_dx and bwd_dbc spill their chunk x chunk tiles. The variant files given here take a 128-token chunk
as two blocks of 64 (bwd_dx: one program a chunk over the block pairs (0, 0), (0, 1), (1, 1); bwd_dbc: one program
per block of a chunk).

First each variant stage is checked against its float64 reference stage at chunk 128 (scripts/probe_stage.py's
check), then the gradients of a forward + backward at chunk 128 against chunk 64's, then both are timed alternately
(GPU time per call from torch.profiler, by kernel). Every stage launches a fixed configuration on both sides: the
walks' tile 64 x 32 at occupancy 2 with two chunks an iteration, bwd_dx's and bwd_dbc's defaults; nothing is tuned.

    python results/probes/backward_chunk128.py --dx FILE --dbc FILE [--rounds 3 --calls 10]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_kernels  # noqa: E402
import probe_stage  # noqa: E402

from kernels.cutile import ssd as cs  # noqa: E402
from kernels.cutile import tuning  # noqa: E402
from kernels.cutile.fwd_pass_state import StateConfig  # noqa: E402
from kernels.cutile.state_walks import after_state_walks  # noqa: E402
from kernels.cutile.variant import load_variant  # noqa: E402
from kernels.reference_backward import Passes  # noqa: E402
from kernels.testing import rel_err  # noqa: E402
from lightning_modules.measure.kernel_names import short_name  # noqa: E402
from lightning_modules.measure.timing import gpu_kernel_ms, summarize  # noqa: E402

WALKS = StateConfig(64, 32, 4, 2, 2)


@contextlib.contextmanager
def backward_at(chunk: int, passes: Passes):
    """The cuTile backward at `chunk` tokens with `passes`, the walks' configuration fixed."""
    saved = cs.BACKWARD_CHUNK, cs.CUTILE
    cs.BACKWARD_CHUNK, cs.CUTILE = chunk, passes
    try:
        with tuning.forced("state_walks", WALKS):
            yield
    finally:
        cs.BACKWARD_CHUNK, cs.CUTILE = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dx", required=True, help="a bwd_dx variant file taking chunks of 128")
    ap.add_argument("--dbc", required=True, help="a bwd_dbc variant file taking chunks of 128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    dx_fn = load_variant(args.dx).bwd_dx
    dbc_fn = load_variant(args.dbc).bwd_dbc
    for stage, fn in (("bwd_dx", dx_fn), ("bwd_dbc", dbc_fn)):
        for dtype in (torch.bfloat16, torch.float32):
            try:
                error = f"{probe_stage.max_error(fn, stage, dtype, 128):.1e}"
            except RuntimeError as e:  # a build that fails: the rest still runs
                error = f"failed: {str(e).splitlines()[0][:160]}"
            print(f"{stage} variant at chunk 128 against float64, {str(dtype)[6:]}: {error}", flush=True)
    sides = {
        "chunk 64": (64, cs.CUTILE),
        "chunk 128": (128, cs.CUTILE._replace(bwd_dx=dx_fn, bwd_dbc=after_state_walks(dbc_fn))),
    }
    inputs = bench_kernels.make_inputs(bench_kernels.SEED, "cuda", requires_grad=True)
    leaves = list(inputs.values())
    dy = torch.randn_like(inputs["x"])

    def call():
        y, _ = cs.ssd_cutile(
            inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], 128, inputs["D"], inputs["dt_bias"],
            True, None, "cutile",
        )  # fmt: skip
        return torch.autograd.grad(y, leaves, dy)

    grads = {}
    for name, (chunk, passes) in sides.items():
        with backward_at(chunk, passes):
            grads[name] = call()
    names = list(inputs)
    print("gradients at chunk 128 against chunk 64, relative norm difference:")
    print("  " + "  ".join(f"{k} {rel_err(a, b):.1e}" for k, a, b in zip(names, grads["chunk 128"], grads["chunk 64"])))
    times: dict[str, list[float]] = {name: [] for name in sides}
    by_kernel: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
    for _ in range(args.rounds):
        for name, (chunk, passes) in sides.items():
            with backward_at(chunk, passes):
                result = gpu_kernel_ms(call, args.calls)
            times[name].append(result["ms"])
            for kernel, ms in result["by_kernel"].items():
                by_kernel[name].setdefault(short_name(kernel), []).append(ms)
    for name in sides:
        st = summarize(times[name])
        print(
            f"{name}: forward + backward {st['median'] * 1e3:.1f} us GPU [{st['min'] * 1e3:.1f}-{st['max'] * 1e3:.1f}]"
        )
        for kernel, ms in by_kernel[name].items():
            print(f"    {kernel:40s} {summarize(ms)['median'] * 1e3:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
