#!/usr/bin/env bash
# A/B of kernel code in separate processes: bench_kernels.py run with each tree's `kernels` package in turn,
# alternating (a1 b1 a2 b2 ...), each tree with its own cache directory (tuning and compiled kernels: a tree's
# later rounds reuse its first round's tuning, never another tree's). For a difference that one process
# cannot show, or that is smaller than the spread between machines (results/tuning_log.md, "exp against exp2").
#
#   bench/ab_kernels.sh OUTDIR ROUNDS NAME=TREE... [-- BENCH_KERNELS ARGS]
#   mkdir -p /tmp/head && git archive HEAD kernels | tar -x -C /tmp/head
#   bench/ab_kernels.sh /tmp/ab 2 head=/tmp/head work=. -- --shapes seed --backends cutile,triton --modes fwd
#
# TREE is a directory holding a `kernels` package (the rest of the code comes from this repository).
# OUTDIR gets NAME_ROUND.json per process and each process's log; each process is stopped after
# AB_TIMEOUT seconds (default 600). Default bench arguments: the seed shape, cutile (both backwards) and
# triton, forward and forward+backward, 5 repeats of 10 calls, tuned. Usage errors exit 2, a failed process 1.
set -uo pipefail
usage="usage: bench/ab_kernels.sh OUTDIR ROUNDS NAME=TREE... [-- BENCH_KERNELS ARGS]"
fail() { echo "ab_kernels: $1" >&2 && exit 2; }
[ $# -ge 2 ] || fail "$usage"
out=$1 rounds=$2
shift 2
[[ $rounds =~ ^[1-9][0-9]*$ ]] || fail "ROUNDS must be a positive whole number, got '$rounds'"
repo=$(CDPATH='' cd -- "$(dirname "$0")/.." && pwd)
names=() trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    name=${1%%=*}
    [[ $1 == *=* && $name =~ ^[A-Za-z0-9._-]+$ ]] || fail "'$1' is not NAME=TREE (NAME: letters, digits, . _ -); $usage"
    [[ " ${names[*]} " != *" $name "* ]] || fail "the name $name is given twice"
    tree=$(CDPATH='' cd -- "${1#*=}" 2>/dev/null && pwd) || fail "no directory ${1#*=}"
    [ -f "$tree/kernels/__init__.py" ] || fail "$tree holds no kernels package"
    names+=("$name") trees+=("$tree")
    shift
done
[ ${#names[@]} -ge 2 ] || fail "give at least two NAME=TREE; $usage"
[ "${1:-}" = "--" ] && shift
bench=("$@")
[ ${#bench[@]} -gt 0 ] || bench=(--shapes seed --backends cutile,cutile:cutile,triton --modes fwd,fwd_bwd
    --repeats 5 --calls 10 --autotune)
mkdir -p "$out"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
trap 'echo "ab_kernels: interrupted" >&2; exit 130' INT TERM
status=0
for round in $(seq 1 "$rounds"); do
    for i in "${!names[@]}"; do
        name=${names[$i]}
        start=$SECONDS
        XDG_CACHE_HOME="$cache/$name" PYTHONPATH="${trees[$i]}:$repo${PYTHONPATH:+:$PYTHONPATH}" \
            timeout --foreground "${AB_TIMEOUT:-600}" python "$repo/bench/bench_kernels.py" "${bench[@]}" \
            --out "$out/${name}_$round.json" >"$out/${name}_$round.log" 2>&1
        rc=$?
        echo "ab_kernels: $name round $round exit $rc in $((SECONDS - start)) s" >&2
        [ $rc = 0 ] || { status=1 && tail -n 3 "$out/${name}_$round.log" >&2; }
    done
done
exit $status
