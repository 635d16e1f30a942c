#!/usr/bin/env bash
# A/B of two trees (or two settings) in one device call: decode-only bench_cuda.py runs that alternate the
# values of VAR, for some rounds, and the decode lines of each.  Needs the extensions built and on the paths
# given.  With VAR "-" each value is a set of VAR=value settings joined by commas ("none" for none).
#   benchmarks/ab_cuda.sh PYTHONPATH "$PWD/.old_tree/python $PWD/python" [rounds=2] [models=7b,1.5b]
#   benchmarks/ab_cuda.sh MINFER_CUDA_GRAPHS "0 1" 2 7b
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
