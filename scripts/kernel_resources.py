"""Registers, stack (spills) and shared memory of the cuTile kernels, with no GPU: each AOT specialization
(kernels/cutile/aot.py) is compiled to a cubin and read with cuobjdump (pip install nvidia-cuda-cuobjdump).

    python scripts/kernel_resources.py --cuobjdump PATH/cuobjdump [--arch sm_90] [--only bwd_dx]
    python scripts/kernel_resources.py --cuobjdump PATH/cuobjdump --only bwd_dbc --hints num_worker_warps=8
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile

from cuda.tile import compilation as ctc

from kernels.cutile import aot


def resources(kernel: object, signature: ctc.KernelSignature, arch: str, cuobjdump: str) -> str:
    """cuobjdump's REG/STACK/SHARED/LOCAL line for one specialization."""
    cubin = io.BytesIO()
    ctc.export_kernel(kernel, [signature], cubin, gpu_code=arch, output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin.getvalue())
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", out)
    return found.group(0) if found else out.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuobjdump", required=True, help="path of the cuobjdump binary")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--only", default="", help="keep specializations whose label contains this text")
    ap.add_argument(
        "--hints",
        default="",
        help="kernel hints to apply, e.g. occupancy=2,num_worker_warps=8 (without: the kernel's own, no occupancy "
        "hint; the launches add their configuration's hints)",
    )
    args = ap.parse_args(argv)
    hints = {k: int(v) for k, v in (h.split("=") for h in args.hints.split(",") if h)}
    for label, kernel, signature in aot.every_signature():
        if args.only in label:
            kernel = kernel.replace_hints(**hints) if hints else kernel
            print(f"{label:60s} {resources(kernel, signature, args.arch, args.cuobjdump)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
