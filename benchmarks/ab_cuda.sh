#!/usr/bin/env bash
# A/B of one lever in one call, as CUDA_NOTES' e2e rows are measured: decode-only bench_cuda.py runs that
# alternate the lever's values, for some rounds, and the chained-decode lines of each.  Needs the extension
# built (benchmarks/run_cuda.sh does it) and on PYTHONPATH.  With VAR "-" each value is a set of VAR=value
# settings joined by commas ("none" for none): levers that only make sense together.
#   benchmarks/ab_cuda.sh MINFER_CUDA_MV_STREAM "0 auto" [rounds=2] [models=7b,1.5b]
#   benchmarks/ab_cuda.sh - "none MINFER_CUDA_NORM_PDL=release,MINFER_CUDA_MV_SPREAD=0" 2 7b
set -uo pipefail
cd "$(dirname "$0")/.."
var=$1; values=$2; rounds=${3:-2}; models=${4:-7b,1.5b}
for r in $(seq "$rounds"); do
  for v in $values; do
    echo "== round $r: $var=$v"
    settings=("$var=$v")
    if [ "$var" = - ]; then settings=(); [ "$v" = none ] || IFS=, read -ra settings <<< "$v"; fi
    env "${settings[@]}" python3 benchmarks/bench_cuda.py --decode-only --reps 3 --models "$models" 2>&1 |
      awk '/^layout/ {on = 1} on {print $1, "tg@512", $7, "tg@4096", $10, "chain@512", $15, "%copy", $17, "chain@4096", $18}' | tail -n +2
  done
done
