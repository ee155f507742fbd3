#!/usr/bin/env bash
# The headline figures: each benchmark run in three separate processes with the same settings (a figure is
# the median of the three, shown with its min-max), then BENCHMARKS.md, the plots and README's headline block.
#
#   bench/headline.sh kernels [N]       # the SSD alone at the seed shape and the steps' (L 2048, 8192): bench_kernels.py
#   bench/headline.sh step [N]          # the medium model's training step, compiled without CUDA graphs: bench_step.py
#   bench/headline.sh step_graphs [N]   # the same step compiled with CUDA graphs (compile mode reduce-overhead)
#   bench/headline.sh step_layers [N]   # that step with the cuTile conv + norm (medium.yaml's layers), 4 timed steps
#   bench/headline.sh step_l8192 [N]    # the same at L 8192, batch 2 (16384 tokens a step, as at L 2048)
#   bench/headline.sh sweep [N]         # the SSD forward alone over the 16 shapes of bench_kernels' sweep
#   bench/headline.sh boundaries [N]    # the medium step (cuTile conv + norm) with packed documents, profiled
#                                       # per kernel, into step_<gpu>_boundaries (h200, h100, ...: nvidia-smi's name)
#   bench/headline.sh tuning [N]        # that step with the shipped cuTile table against a fresh search, processes
#                                       # alternating, into tuning_<gpu>_{search,shipped,fresh}
#   bench/headline.sh long [N]          # configs/long.yaml through train.py (bench/curves.py), cuTile + cuTile
#                                       # backward and Triton, into long_<L>_<gpu>: SEQ=65536 (default: batch 1, 200
#                                       # steps), SEQ=16384 (batch 4, 200 steps) or SEQ=131072 (batch 1, 30 steps;
#                                       # CHECKPOINT=1 adds checkpoint_layers, for a GPU it does not fit without)
#   bench/headline.sh long_seed [N]     # the same for the seed's design (cuTile forward, reference backward), alone
#                                       # in its processes (it takes as long as the other two), into long_<L>_<gpu>_seed
#   bench/headline.sh report            # render what results/ holds (no GPU needed): BENCHMARKS.md's command
#
# Backends alternate within each process; cuTile and Triton are both tuned and warmed before timing. Each
# process prints its wall time. The first `kernels` process compiles and tunes at its three shapes (the later ones
# reuse the caches it leaves), and each `step` process compiles every variant and runs 3 warm-up and 10 timed
# steps: each takes minutes, so N runs one process at a time (`kernels 1`, `kernels 2`, ...).
# Each invocation's first process is preceded by bench/precompile.py, which compiles tuning's candidates in
# PRECOMPILE_JOBS (default: CPU cores) parallel processes (if it fails, that process compiles as it tunes).
# How long each part's processes take: docs/measuring.md.
# PRECOMPILE=0 skips the precompile, for processes 2 and 3 on a machine whose caches process 1 filled.
# RESULTS (default results/) says where the JSON goes, OUT (default the repository) where BENCHMARKS.md and
# README.md are.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: bench/headline.sh kernels|step|step_graphs|step_layers|step_l8192|sweep|boundaries|tuning|long|long_seed|report}
results=${RESULTS:-results}
kernels_series=kernels_h200_headline
step_series=step_h200_compiled
graphs_series=step_h200_cudagraphs
layers_series=step_h200_layers_graphs_quick
l8192_series=step_h200_l8192_layers_graphs_quick
sweep_series=kernels_h200_sweep
scaling_run=scaling_h200x2  # a single-process run: the report labels it "1 run"
boundaries_series=step_h200_boundaries,step_h100_boundaries  # the report renders each present one

only=${2:-}
case $only in "" | 1 | 2 | 3) ;; *) echo "bench/headline.sh: process number must be 1, 2 or 3" >&2 && exit 2 ;; esac

run3() {  # run3 SERIES COMMAND...: processes 1-3 (or only $only); 1 writes SERIES.json, N SERIES_run<N>.json
    local series=$1
    shift
    local i cut=$#  # --out goes before a `--` (the arguments after it are the command's to pass on), else last
    for ((i = 1; i <= $#; i++)); do [ "${!i}" = -- ] && cut=$((i - 1)) && break; done
    for n in ${only:-1 2 3}; do
        local out="$results/$series.json"
        [ "$n" = 1 ] || out="$results/${series}_run$n.json"
        local start=$SECONDS
        "${@:1:cut}" --out "$out" "${@:cut+1}"
        echo "headline: $series process $n took $((SECONDS - start)) s" >&2
    done
}

gpu_model() {  # the GPU's model in lower case (h200, h100, ...) from nvidia-smi's name, for series names
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -o -i -E '\b[a-z][0-9]{2,4}\b' | head -n 1 || true)
    [ -n "$gpu" ] || { echo "bench/headline.sh: no GPU model in nvidia-smi's names" >&2 && return 2; }
    echo "${gpu,,}"
}

precompile() {  # precompile SHAPES [OPTION...]: compile tuning's candidates at bench_kernels' SHAPES first
    [ "${PRECOMPILE:-1}" = 0 ] && echo "headline: PRECOMPILE=0, no precompile" >&2 && return 0
    python -m bench.precompile --shapes "$@" --jobs "${PRECOMPILE_JOBS:-$(nproc)}" --timeout 900 \
        || echo "headline: precompile failed; the first process compiles as it tunes" >&2
}

case $part in
kernels)
    precompile seed,step,step_l8192
    run3 "$kernels_series" python -m bench.bench_kernels --shapes seed,step,step_l8192 --backends cutile,cutile:cutile,triton \
        --modes fwd,fwd_bwd --repeats 5 --calls 10 --autotune
    ;;
step)
    # the medium model's SSD is bench_kernels' step shape: its x/B/C views compile as bench_kernels' tensors do
    # (profiles show the same specializations); its dt is bf16, so chunk_cumsum still compiles in process 1
    precompile step
    run3 "$step_series" python -m bench.bench_step --configs medium --modes compile --compile_mode default \
        --backends standin,triton,cutile,cutile_bwd --autotune
    ;;
step_graphs)
    precompile step
    # without the reference backward (the series as committed); with the cuTile layers, step_layers has it
    run3 "$graphs_series" python -m bench.bench_step --configs medium --modes compile --compile_mode reduce-overhead \
        --backends standin,triton,cutile_bwd --autotune
    ;;
step_layers)
    # the plain triton row is the layers' gain for Triton; the report shows it from step_graphs, listed first.
    # cutile+conv+norm is the seed's design (the reference backward) in the same step
    precompile step
    run3 "$layers_series" python -m bench.bench_step --configs medium --modes compile --compile_mode reduce-overhead \
        --backends standin+conv+norm,triton,triton+conv+norm,cutile_bwd+conv+norm,cutile+conv+norm --quick --autotune
    ;;
step_l8192)
    # bench_kernels' step_l8192 is this step's SSD (batch 2, L 8192, 24 heads), as step is for the L 2048 step
    precompile step_l8192
    run3 "$l8192_series" python -m bench.bench_step --configs medium --seqlens 8192 --modes compile \
        --compile_mode reduce-overhead --backends standin+conv+norm,triton+conv+norm,cutile_bwd+conv+norm,cutile+conv+norm \
        --quick --autotune
    ;;
boundaries)
    gpu=$(gpu_model)
    precompile step
    run3 "step_${gpu}_boundaries" python -m bench.bench_step --configs medium --seqlens 2048 --modes compile \
        --backends triton+conv+norm,cutile_bwd+conv+norm --documents none,stdlib,short --warmup 3 --steps 20 --profile
    ;;
tuning)
    # medium.yaml's step (documents as the stdlib corpus packs them) with the shipped table against a fresh search:
    # process 1 first searches every shape into a scratch cache with the shipped table ignored (tuning_<gpu>_search);
    # then each process N runs the shipped table (an empty cache), then the search's choices (that cache, no table)
    gpu=$(gpu_model)
    cache=${TUNING_CACHE:-${TMPDIR:-/tmp}/mamba2-cutile-fresh-tuning.json}
    step=(python -m bench.bench_step --configs medium --seqlens 2048 --modes compile --backends cutile_bwd+conv+norm
        --documents stdlib --warmup 3 --steps 20)
    if [ "${only:-1}" = 1 ] && [ "${SEARCH:-1}" = 1 ]; then  # SEARCH=0: keep the cache an earlier search left
        precompile step --documents stdlib --layers --no-triton  # the block's kernels: SSD, conv, norm
        rm -f "$cache"
        start=$SECONDS
        "${step[@]}" --autotune --tuning_cache "$cache" --shipped_table none --out "$results/tuning_${gpu}_search.json"
        echo "headline: tuning_${gpu}_search took $((SECONDS - start)) s" >&2
    fi
    [ -f "$cache" ] || { echo "bench/headline.sh: no fresh search at $cache (run process 1 first)" >&2 && exit 2; }
    rm -f "$cache.empty"
    for n in ${only:-1 2 3}; do
        suffix=$([ "$n" = 1 ] || echo "_run$n")
        start=$SECONDS
        "${step[@]}" --no-autotune --tuning_cache "$cache.empty" --out "$results/tuning_${gpu}_shipped$suffix.json"
        "${step[@]}" --no-autotune --tuning_cache "$cache" --shipped_table none \
            --out "$results/tuning_${gpu}_fresh$suffix.json"
        echo "headline: tuning_${gpu} pair $n took $((SECONDS - start)) s" >&2
    done
    ;;
long | long_seed)
    # one process: one train.py run per variant, one after the other. At L 65536 cuTile and Triton took 335 s of
    # an H200's first process (caches cold), about 200 s of an H100's later ones; the seed's design as long alone.
    gpu=$(gpu_model)
    seq=${SEQ:-65536}
    case $seq in
    16384) shape=(--steps 200 -- --data.seq_len=16384 --data.batch_size=4) ;;
    65536) shape=(--steps 200 -- --data.seq_len=65536 --data.batch_size=1) ;;
    131072) shape=(--steps 30 -- --data.seq_len=131072 --data.batch_size=1 --data.val_fraction=0.1) ;;
    *) echo "bench/headline.sh: SEQ must be 16384, 65536 or 131072" >&2 && exit 2 ;;
    esac
    [ "${CHECKPOINT:-0}" = 1 ] && shape+=(--model.config.checkpoint_layers=true)
    if [ "$part" = long ]; then
        series=long_${seq}_${gpu}
        variants=(--run cutile=--model.config.ssd_backend=cutile,--model.config.ssd_backward=cutile
            --run triton=--model.config.ssd_backend=triton,--model.config.ssd_backward=reference)
    else
        series=long_${seq}_${gpu}_seed
        variants=(--run cutile_reference=--model.config.ssd_backend=cutile,--model.config.ssd_backward=reference)
    fi
    run3 "$series" python -m bench.curves --config configs/long.yaml "${variants[@]}" "${shape[@]}"
    ;;
sweep)
    precompile sweep --modes fwd --no-triton
    run3 "$sweep_series" python -m bench.bench_kernels --shapes sweep --backends cutile,triton --modes fwd --autotune
    ;;
report)
    # BENCHMARKS.md's first line is this command's, so rerunning it on the committed results changes nothing. The
    # step without CUDA graphs, the L 8192 series, the scaling run and the sweep are left out when absent (their
    # earlier single runs live in git history). The other series must exist.
    steps=$graphs_series,$layers_series
    [ -f "$results/$step_series.json" ] && steps=$step_series,$steps
    [ -f "$results/$l8192_series.json" ] && steps=$steps,$l8192_series
    scaling=()
    [ -f "$results/$scaling_run.json" ] && scaling=(--scaling "$scaling_run")
    sweep=()  # the sweep's series lives in git history (kept out of the tree for size); rendered when present
    [ -f "$results/$sweep_series.json" ] && sweep=(--sweep "$sweep_series")
    python -m bench.report --results "$results" --out "${OUT:-.}" --kernels "$kernels_series" --step "$steps" \
        "${scaling[@]}" "${sweep[@]}" --boundaries "$boundaries_series"
    ;;
*)
    echo "bench/headline.sh: unknown part '$part'; use kernels, step, step_graphs, step_layers, step_l8192, sweep," \
        "boundaries, tuning, long, long_seed or report" >&2
    exit 2
    ;;
esac
