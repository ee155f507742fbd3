#!/usr/bin/env bash
# Run the GPU tests split over parallel processes: cuTile compiles each kernel specialization once per
# machine (its disk cache is shared), so parallel processes spread the compiling over the CPU cores while
# they share the GPUs. Job i runs on the i-th GPU (mod their number) of CUDA_VISIBLE_DEVICES when it is set,
# else of those nvidia-smi lists; with none visible it stops (exit 2) rather than let every test skip.
#
#   bench/gpu_check.sh OUTDIR JOBS [PYTEST SELECTION...]
#   bench/gpu_check.sh "$OUT" 12 tests/kernels/test_cutile_stages_gpu.py tests/kernels/test_cutile_backward_gpu.py -k "not tuning"
#
# The selected tests (marker gpu) are dealt round-robin to JOBS processes, each stopped after
# GPU_CHECK_TIMEOUT seconds (default 540). A test still running after GPU_CHECK_STACK seconds (default 180)
# has every thread's stack written to its job's log (pytest's faulthandler_timeout); for each job that timed
# out, the test it was running and the innermost frames of its last such dump are printed. OUTDIR gets the
# collected ids (ids.txt, collect.txt), each job's log (jobN.txt) and exit code (exit_codes.txt), every
# test's outcome (outcomes.txt), and the tests with none (no_outcome.txt: the job timed out or crashed
# first); each skipped test is printed with its reason. Exits 1 when a test failed or has no outcome, every test skipped, or a job ended with anything but
# 0 (a crash at exit included); 2 when the selection cannot be collected or no GPU is visible.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUTDIR JOBS [PYTEST SELECTION...]}
jobs=${2:?usage: bench/gpu_check.sh OUTDIR JOBS [PYTEST SELECTION...]}
shift 2
mkdir -p "$out"
if ! python -m pytest --collect-only -q -m gpu -p no:cacheprovider "$@" >"$out/collect.txt" 2>&1; then
    echo "gpu_check: the selection does not collect:" >&2
    tail -n 20 "$out/collect.txt" >&2
    exit 2
fi
grep '::' "$out/collect.txt" >"$out/ids.txt"
read -r -a gpus <<<"$(echo "${CUDA_VISIBLE_DEVICES-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)}" | tr ',\n' '  ')"
if [ "${#gpus[@]}" -eq 0 ]; then
    echo "gpu_check: no GPU visible (CUDA_VISIBLE_DEVICES or nvidia-smi): every GPU test would skip" >&2
    exit 2
fi
echo "gpu_check: $(wc -l <"$out/ids.txt") tests in $jobs processes on GPU(s) ${gpus[*]}"
pids=()
for i in $(seq 0 $((jobs - 1))); do
    awk -v n="$jobs" -v i="$i" '(NR - 1) % n == i' "$out/ids.txt" >"$out/ids$i.txt"
    [ -s "$out/ids$i.txt" ] || continue
    CUDA_VISIBLE_DEVICES=${gpus[$((i % ${#gpus[@]}))]} timeout "${GPU_CHECK_TIMEOUT:-540}" \
        xargs -a "$out/ids$i.txt" -d '\n' python -m pytest -v -m gpu -p no:cacheprovider \
        -o faulthandler_timeout="${GPU_CHECK_STACK:-180}" >"$out/job$i.txt" 2>&1 &
    pids[i]=$!
done
: >"$out/exit_codes.txt"
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    echo "job$i $?" >>"$out/exit_codes.txt"
done
rm -f "$out"/ids[0-9]*.txt
grep -hoE '^tests/.* (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)' "$out"/job*.txt | sort >"$out/outcomes.txt"
sed -E 's/ [A-Z]+$//' "$out/outcomes.txt" | sort | comm -23 <(sort "$out/ids.txt") - >"$out/no_outcome.txt"
bad_jobs=$(awk '$2 != 0' "$out/exit_codes.txt")
echo "gpu_check: $(awk '{print $NF}' "$out/outcomes.txt" | sort | uniq -c | tr -s ' \n' ' ')no outcome $(wc -l <"$out/no_outcome.txt")"
grep -hoE '^tests/[^ ]+ SKIPPED \(.*\)' "$out"/job*.txt | sort | sed 's/^/gpu_check: /'  # each skip, with its reason
[ -z "$bad_jobs" ] || echo "gpu_check: jobs that did not exit with 0 (exit code; 123: pytest reported failures or" \
    "errors; 124: timed out; 125: killed by a signal, a crash at exit included): $(echo "$bad_jobs" | tr '\n' ' ')"
for i in $(awk '$2 == 124 {sub("job", "", $1); print $1}' "$out/exit_codes.txt"); do
    echo "gpu_check: job$i timed out in $(grep -oE '^tests/[^ ]+' "$out/job$i.txt" | tail -n 1)"
    awk '/^Timeout \(/ {frames = ""; n = 0; next} /^ *File "/ && n < 6 {frames = frames "    " $0 "\n"; n++}
        END {printf "%s", frames}' "$out/job$i.txt"
done
all_skipped=$(awk '$NF != "SKIPPED" {n++} END {print (NR > 0 && n == 0)}' "$out/outcomes.txt")
[ "$all_skipped" = 0 ] || echo "gpu_check: every test skipped" >&2
grep -E ' (FAILED|ERROR)$' "$out/outcomes.txt"
if grep -qE ' (FAILED|ERROR)$' "$out/outcomes.txt" || [ -s "$out/no_outcome.txt" ] || [ -n "$bad_jobs" ] \
    || [ "$all_skipped" = 1 ]; then
    exit 1
fi
