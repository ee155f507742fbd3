"""Registers, stack (spills) and shared memory of the cuTile kernels, with no GPU: each AOT specialization (each
kernel module's aot_signatures, as bench/aot.py gathers them) is compiled to a cubin and read with cuobjdump (the
nvidia-cuda-cuobjdump wheel of requirements-dev.txt, or --cuobjdump PATH).

    python -m bench.kernel_resources [--arch sm_90] [--only bwd_dx]
    python -m bench.kernel_resources --only bwd_dbc --hints num_worker_warps=8
    python -m bench.kernel_resources --launched NAME [--file VARIANT.py] [--sass]

The declared signatures assume nothing of strides, sizes or alignment. A launch specializes on what its tensors
give (strides and sizes divisible by 8 or 16, 16-byte base addresses, 32-bit indices), and that build can
differ: more shared memory, other spills. --launched takes a kernel name as a GPU profile shows it (the
mangled name encodes the launch's signature) and compiles that specialization, from the production module
whose kernel has that name or from --file, a changed copy of it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import io
import pkgutil
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from cuda.tile import compilation as ctc

from bench import aot
from bench.variants import load_variant
from kernels import cutile

# the instructions --sass counts, with their modifiers (LDG.E.128, MUFU.EX2, ...): memory, special functions, and
# the warpgroup matrix products with the waits around them (HGMMA, WARPGROUP.ARRIVE, WARPGROUP.DEPBAR)
SASS_OPS = re.compile(r"\b((?:LDG|STG|LDS|STS|LDGSTS|UTMALDG|UTMASTG|MUFU|HGMMA|WARPGROUP)(?:\.\w+)*)")


def threads(elf: str) -> int | None:
    """Threads per program from `cuobjdump -elf`'s EIATTR_REQNTID (x·y·z), None without one: with REG, what fixes
    how many programs fit an SM (65,536 registers)."""
    found = re.search(r"EIATTR_REQNTID\s+Format:\s+\S+\s+Value:\s+(0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+)", elf)
    return None if found is None else int(found[1], 16) * int(found[2], 16) * int(found[3], 16)


def resources(kernel: object, signature: ctc.KernelSignature, arch: str, cuobjdump: str, sass: bool = False) -> str:
    """cuobjdump's REG/STACK/SHARED/LOCAL line for one specialization and its threads per program; with `sass`, then
    its SASS's instruction count and the count of each memory, MUFU, HGMMA and WARPGROUP instruction (cuobjdump -sass
    needs nvdisasm on PATH)."""
    cubin = io.BytesIO()
    ctc.export_kernel(kernel, [signature], cubin, gpu_code=arch, output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin.getvalue())
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        found = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", out)
        line = found.group(0) if found else out.strip()
        elf = subprocess.run([cuobjdump, "-elf", f.name], capture_output=True, text=True, check=True).stdout
        line += f" THREADS:{threads(elf)}"
        if sass:
            code = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
            counts = Counter(SASS_OPS.findall(code))
            total = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", code, re.MULTILINE))
            line += f"  {total} instructions: " + " ".join(f"{op}x{n}" for op, n in counts.most_common())
    return line


def launched(name: str, path: str | None) -> tuple[str, object, ctc.KernelSignature]:
    """(label, kernel, signature) of the specialization a profile's kernel name encodes; the kernel from `path`, or
    from the kernels/cutile module defining it."""
    function, signature = ctc.demangle_kernel_name(name)
    if path is not None:
        modules = [load_variant(path)]
    else:
        modules = [importlib.import_module(f"kernels.cutile.{m.name}") for m in pkgutil.iter_modules(cutile.__path__)]
    for module in modules:
        if hasattr(module, function):
            kernel = getattr(module, function)
            takes = len(inspect.signature(getattr(kernel, "_pyfunc", kernel)).parameters)
            if takes != len(signature.parameters):
                raise SystemExit(
                    f"kernel_resources: the name encodes {len(signature.parameters)} parameters, {function} in "
                    f"{path or module.__name__} takes {takes}: a name launched by other code than this"
                )
            constants = [p.value for p in signature.parameters if isinstance(p, ctc.ConstantConstraint)]
            return f"{function}{constants}", kernel, signature
    raise SystemExit(f"kernel_resources: no kernel {function} in {path or 'kernels/cutile'}")


def wheel_cuobjdump() -> str | None:
    """The cuobjdump binary of the nvidia-cuda-cuobjdump wheel, or None where the wheel is not installed."""
    spec = importlib.util.find_spec("nvidia")
    found = [Path(d) / "cu13" / "bin" / "cuobjdump" for d in (spec.submodule_search_locations if spec else [])]
    return next((str(f) for f in found if f.exists()), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = wheel_cuobjdump()
    ap.add_argument(
        "--cuobjdump",
        default=default,
        required=default is None,
        help=f"path of the cuobjdump binary (default: the nvidia-cuda-cuobjdump wheel's, {default})",
    )
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--only", default="", help="keep specializations whose label contains this text")
    ap.add_argument(
        "--hints",
        default="",
        help="kernel hints to apply, e.g. occupancy=2,num_worker_warps=8 (without: the kernel's own, no occupancy "
        "hint; the launches add their configuration's hints)",
    )
    ap.add_argument("--launched", default=None, help="a kernel name from a GPU profile (mangled): that specialization")
    ap.add_argument("--file", default=None, help="with --launched: take the kernel from this changed module copy")
    ap.add_argument(
        "--sass",
        action="store_true",
        help="also count the memory and MUFU instructions (cuobjdump -sass: pip install nvidia-cuda-nvdisasm, "
        "its nvdisasm on PATH)",
    )
    args = ap.parse_args(argv)
    hints = {k: int(v) for k, v in (h.split("=") for h in args.hints.split(",") if h)}
    cases = [launched(args.launched, args.file)] if args.launched else aot.every_signature()
    for label, kernel, signature in cases:
        if args.only in label:
            kernel = kernel.replace_hints(**hints) if hints else kernel
            print(f"{label:60s} {resources(kernel, signature, args.arch, args.cuobjdump, args.sass)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
