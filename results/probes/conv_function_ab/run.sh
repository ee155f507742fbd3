#!/usr/bin/env bash
# the stand-in step (rest of the step) under CUDA graphs: production layers.py, then the conv as an autograd.Function
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
log=$OUT/call4.log
start=$SECONDS
for v in production function; do
  if [ $v = function ]; then cp probe_variants/conv/layers.py lightning_modules/model/layers.py; fi
  timeout $(( 280 - (SECONDS - start) )) python scripts/bench_step.py --configs medium --modes compile --compile_mode reduce-overhead \
    --backends standin --quick --no-autotune --out $OUT/standin_$v.json > /tmp/$v.txt 2>&1
  echo "$v rc=$? t=$((SECONDS-start))" >> $log
  grep "medium L=" /tmp/$v.txt >> $log
  tail -n 3 /tmp/$v.txt >> $log
done
