#!/usr/bin/env bash
# The stand-in step (the rest of the step) of the medium model under CUDA graphs: production and each variant of
# the layers' compiled code, one process each, alternating, for the rounds named. A variant is patches of
# results/variants/ applied before its process and reverted after it.
#
#   results/probes/step_variants_ab.sh OUTDIR ROUND...      # e.g. OUTDIR 1 2 3, or one round per call
#   VARIANTS="production conv_function" results/probes/step_variants_ab.sh OUTDIR 1   # only the variants named
#   VARIANTS="production conv_function" BACKENDS=standin+conv+norm,cutile_bwd+conv+norm TUNE=--autotune \
#       results/probes/step_variants_ab.sh OUTDIR 1   # other rows of the step too
#   VARIANTS="production passthrough" BACKENDS=standin+conv+norm TUNE=--autotune results/probes/step_variants_ab.sh \
#       OUTDIR 1   # the stand-in y = x·D against y = x: the stand-in's own D work in the rest-of-step row
#
# OUTDIR gets standin_<variant>_run<ROUND>.json and .log per process (about 80 s each on one H200 with the stand-in
# alone). BACKENDS (default standin) are bench_step's variants each process runs, TUNE (default --no-autotune)
# whether they tune (a variant that launches a cuTile kernel at new shapes needs --autotune). The default variants
# are production, realize_reads, reads_padding and reads_function. Each variant compiles its own graphs: the
# model keys torch.compile's disk caches by the code (LanguageModel.configure_model), since Inductor's own key misses
# a custom op's tags.
set -u
out=${1:?usage: results/probes/step_variants_ab.sh OUTDIR ROUND...}
shift
cd "$(dirname "$0")/../.."
reads=results/variants/inductor_realize_reads.patch
declare -A patches=(
    [production]=""
    [conv_function]="results/variants/conv_function.patch"
    [realize_reads]="$reads"
    [reads_padding]="$reads results/variants/conv_recompute_padding.patch"
    [reads_function]="$reads results/variants/conv_function.patch"
    [passthrough]="results/variants/standin_passthrough.patch"
)
for variant in ${VARIANTS:-}; do
    [[ -v patches[$variant] ]] || { echo "step_variants_ab: unknown variant $variant; choose from ${!patches[*]}" >&2 && exit 2; }
done
mkdir -p "$out"
for round in "$@"; do
    for variant in ${VARIANTS:-production realize_reads reads_padding reads_function}; do
        for p in ${patches[$variant]}; do patch -p1 -s --no-backup-if-mismatch <"$p" || exit 1; done
        python scripts/bench_step.py --configs medium --modes compile --compile_mode reduce-overhead --backends "${BACKENDS:-standin}" \
            --quick "${TUNE:---no-autotune}" --out "$out/standin_${variant}_run$round.json" >"$out/standin_${variant}_run$round.log" 2>&1
        echo "round $round $variant: exit $? $(grep -oE '[a-z_+]+ +step +[0-9.]+ ms' "$out/standin_${variant}_run$round.log" | tr -s ' \n' ' ')"
        for p in $(printf '%s\n' ${patches[$variant]} | tac); do patch -p1 -R -s --no-backup-if-mismatch <"$p" || exit 1; done
    done
done
