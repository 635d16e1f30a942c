#!/usr/bin/env bash
# Build minfer with CUDA, run the GPU tests and the CUDA benchmark on a GPU
# machine (how the lent H200 runs were made).  Logs go to $OUT (or ./cuda-out).
#   benchmarks/run_cuda.sh [tests|bench|all] [pytest -k expression]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/cuda-out}; mkdir -p "$OUT"
what=${1:-all}; kexpr=${2:-}
export PYTHONUNBUFFERED=1 MINFER_CACHE=${MINFER_CACHE:-/tmp/minfer-cache}
[ -d .shared_copy ] && export MINFER_SHARED=${MINFER_SHARED:-$PWD/.shared_copy}
if ls .whl/*.whl >/dev/null 2>&1; then  # wheels carried to a machine without a registry
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && \
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
B=/tmp/minfer-build
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMINFER_CUDA=ON \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$OUT/build.log" 2>&1 &&
  ninja -C $B >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
so=$(ls $B/_minfer*.so); ln -sf "$so" python/minfer/
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import minfer; print(minfer.cuda_info())"
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -rs -x tests/test_cuda.py tests/test_cuda_forward.py tests/test_cuda_matvec.py tests/test_llamacpp_synthetic.py ${kexpr:+-k "$kexpr"} \
    2>&1 | tee "$OUT/tests.log" | tail -40
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 benchmarks/bench_cuda.py --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -20
fi
