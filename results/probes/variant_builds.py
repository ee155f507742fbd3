"""The builds (sm_90) of the SSD kernels' variants in results/variants/ beside production's, at the specializations
the seed shape's and the step layer's headline launched (their mangled names in results/kernels_h200_headline.json):
registers, stack, shared memory, instruction count, and the memory, MUFU, HGMMA and WARPGROUP instructions (the
waits around each warpgroup matrix product). Needs cuobjdump and nvdisasm on PATH (scripts/kernel_resources.py says
how). Make the variant files first, named after their patches:

    mkdir -p /tmp/variants
    for v in fwd_pass_state_mma_off_chain bwd_pass_state_mma_off_chain chunk_cumsum_bwd_occupancy \\
        compute_out_steps compute_out_mma_apart bwd_dx_mma_apart; do
        patch "$(head -1 results/variants/$v.patch | sed 's|--- a/||')" -o /tmp/variants/$v.py < results/variants/$v.patch
    done
    PYTHONPATH=. python results/probes/variant_builds.py --cuobjdump PATH /tmp/variants/*.py

A variant kernel with parameters past the launched signature's (compute_out_steps' STEPS, compute_out_heads' HEADS,
the state walks' STORE_TMA) is built with each value in EXTRA; every build is printed at occupancy 1, 2 and 4 (bwd_dx
also with 8 worker warps), or with the hints --hints gives, e.g. a program over a cluster of CTAs:

    PYTHONPATH=. python results/probes/variant_builds.py --cuobjdump PATH \
        --hints '[{"occupancy": 2}, {"occupancy": 2, "num_ctas": 2}]' /tmp/variants/compute_out_ctas.py
"""

import argparse
import inspect
import json
from pathlib import Path

from cuda.tile import compilation as ctc

from kernels.cutile.variant import load_variant
from scripts.kernel_resources import launched, resources

EXTRA = {"STEPS": (1, 2, 4), "HEADS": (2, 4, 8), "STORE_TMA": (True, False)}
HINTS = [{"occupancy": o} for o in (1, 2, 4)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--hints", type=json.loads, default=None, help="a JSON list of hint sets to build each kernel with")
    ap.add_argument("variants", nargs="+", help="variant files of kernels/cutile modules")
    args = ap.parse_args()
    records = json.loads(Path("results/kernels_h200_headline.json").read_text())["records"]
    names = sorted({(r["shape"]["seqlen"], k) for r in records for k in r["top_kernels_ms"] if "_Kt" in k})
    for path in args.variants:
        variant = load_variant(path)
        for seqlen, name in names:
            label, kernel, signature = launched(name, None)
            function = name.split("_Kt")[0]
            if not hasattr(variant, function):
                continue
            changed = getattr(variant, function)
            extra = list(inspect.signature(changed._pyfunc).parameters)[len(signature.parameters) :]
            hints = args.hints or HINTS + (
                [{"occupancy": 2, "num_worker_warps": 8}] if function == "bwd_dx_kernel" else []
            )
            for hint in hints:
                print(f"{Path(path).stem} at L {seqlen}: {label} {hint}", flush=True)
                print(
                    f"    production {resources(kernel.replace_hints(**hint), signature, 'sm_90', args.cuobjdump, True)}"
                )
                for values in zip(*(EXTRA[e] for e in extra)) if extra else [()]:
                    sig = ctc.KernelSignature(
                        (*signature.parameters, *(ctc.ConstantConstraint(v) for v in values)),
                        calling_convention=signature.calling_convention,
                    )
                    tag = " ".join(f"{e}={v}" for e, v in zip(extra, values)) or "variant"
                    built = resources(changed.replace_hints(**hint), sig, "sm_90", args.cuobjdump, True)
                    print(f"    {tag} {built}", flush=True)


if __name__ == "__main__":
    main()
