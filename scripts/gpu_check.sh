#!/usr/bin/env bash
# Run the GPU tests split over parallel processes: cuTile compiles each kernel specialization once per
# machine (its disk cache is shared), so parallel processes spread the compiling over the CPU cores while
# they share the GPUs. Job i runs on GPU i mod (number of GPUs).
#
#   scripts/gpu_check.sh OUTDIR JOBS [PYTEST SELECTION...]
#   scripts/gpu_check.sh "$OUT" 12 tests/test_cutile_stages_gpu.py tests/test_cutile_backward_gpu.py -k "not tuning"
#
# The selected tests (marker gpu) are dealt round-robin to JOBS processes, each stopped after
# GPU_CHECK_TIMEOUT seconds (default 540). OUTDIR gets each job's log (jobN.txt), every test's outcome
# (outcomes.txt), and the tests no job reached before its time ran out (not_reached.txt).
set -u
out=${1:?usage: scripts/gpu_check.sh OUTDIR JOBS [PYTEST SELECTION...]}
jobs=${2:?usage: scripts/gpu_check.sh OUTDIR JOBS [PYTEST SELECTION...]}
shift 2
mkdir -p "$out"
python -m pytest --collect-only -q -m gpu -p no:cacheprovider "$@" | grep '::' >"$out/ids.txt"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -gt 0 ] || gpus=1
echo "gpu_check: $(wc -l <"$out/ids.txt") tests in $jobs processes on $gpus GPU(s)"
for i in $(seq 0 $((jobs - 1))); do
    awk -v n="$jobs" -v i="$i" '(NR - 1) % n == i' "$out/ids.txt" >"$out/ids$i.txt"
    [ -s "$out/ids$i.txt" ] || continue
    CUDA_VISIBLE_DEVICES=$((i % gpus)) timeout "${GPU_CHECK_TIMEOUT:-540}" \
        xargs -a "$out/ids$i.txt" -d '\n' python -m pytest -v -m gpu -p no:cacheprovider >"$out/job$i.txt" 2>&1 &
done
wait
grep -hoE '^tests/.* (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)' "$out"/job*.txt | sort >"$out/outcomes.txt"
sed -E 's/ [A-Z]+$//' "$out/outcomes.txt" | sort | comm -23 <(sort "$out/ids.txt") - >"$out/not_reached.txt"
echo "gpu_check: $(awk '{print $NF}' "$out/outcomes.txt" | sort | uniq -c | tr -s ' \n' ' ')not reached $(wc -l <"$out/not_reached.txt")"
grep -E ' (FAILED|ERROR)$' "$out/outcomes.txt" || true
