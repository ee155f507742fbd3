#!/usr/bin/env bash
# A/B of kernel code in separate processes: bench_kernels.py run with each tree's `kernels` package in turn,
# alternating (a1 b1 a2 b2 ...), each tree with its own cache directory (tuning and compiled kernels: a tree's
# later rounds reuse its first round's tuning, never another tree's). For a difference that one process
# cannot show, or that is smaller than the spread between machines (results/tuning_log.md, "exp against exp2").
#
#   scripts/ab_kernels.sh OUTDIR ROUNDS NAME=TREE... [-- BENCH_KERNELS ARGS]
#   git archive HEAD kernels | tar -x -C /tmp/head
#   scripts/ab_kernels.sh /tmp/ab 2 head=/tmp/head work=. -- --shapes seed --backends cutile,triton --modes fwd
#
# TREE is a directory holding a `kernels` package (the rest of the code comes from this repository).
# OUTDIR gets NAME_ROUND.json per process and each process's log; each process is stopped after
# AB_TIMEOUT seconds (default 600). Default bench arguments: the seed shape, cutile and triton, forward and
# forward+backward, 5 repeats of 10 calls, tuned.
set -uo pipefail
usage="usage: scripts/ab_kernels.sh OUTDIR ROUNDS NAME=TREE... [-- BENCH_KERNELS ARGS]"
out=${1:?$usage}
rounds=${2:?$usage}
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
names=() trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in *=*) ;; *) echo "ab_kernels: '$1' is not NAME=TREE; $usage" >&2 && exit 2 ;; esac
    tree=$(cd "${1#*=}" 2>/dev/null && pwd) || { echo "ab_kernels: no directory ${1#*=}" >&2 && exit 2; }
    [ -f "$tree/kernels/__init__.py" ] || { echo "ab_kernels: $tree holds no kernels package" >&2 && exit 2; }
    names+=("${1%%=*}") trees+=("$tree")
    shift
done
[ ${#names[@]} -ge 2 ] || { echo "ab_kernels: give at least two NAME=TREE; $usage" >&2 && exit 2; }
[ "${1:-}" = "--" ] && shift
bench=("$@")
[ ${#bench[@]} -gt 0 ] || bench=(--shapes seed --backends cutile:cutile,triton --modes fwd,fwd_bwd --repeats 5
    --calls 10 --autotune)
mkdir -p "$out"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
status=0
for round in $(seq 1 "$rounds"); do
    for i in "${!names[@]}"; do
        name=${names[$i]}
        start=$SECONDS
        XDG_CACHE_HOME="$cache/$name" PYTHONPATH="${trees[$i]}:$repo${PYTHONPATH:+:$PYTHONPATH}" \
            timeout "${AB_TIMEOUT:-600}" python "$repo/scripts/bench_kernels.py" "${bench[@]}" \
            --out "$out/${name}_$round.json" >"$out/${name}_$round.log" 2>&1
        rc=$?
        echo "ab_kernels: $name round $round exit $rc in $((SECONDS - start)) s" >&2
        [ $rc = 0 ] || { status=1 && tail -n 3 "$out/${name}_$round.log" >&2; }
    done
done
exit $status
