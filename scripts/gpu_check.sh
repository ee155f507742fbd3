#!/usr/bin/env bash
# Run the GPU test files in parallel processes (cuTile compiles each kernel specialization once per
# process; parallel processes share the GPU and spread the compiling over the CPU cores).
# Usage on a GPU machine: scripts/gpu_check.sh OUTDIR "tests/x.py -k 'a and b'" "tests/y.py" ...
set -u
out=$1
shift
i=0
for args in "$@"; do
    i=$((i + 1))
    eval "timeout ${GPU_CHECK_TIMEOUT:-540} python -m pytest -q -m gpu -p no:cacheprovider $args" >"$out/job$i.txt" 2>&1 &
done
wait
for f in "$out"/job*.txt; do
    echo "== $f: $(tail -n 1 "$f")"
done
