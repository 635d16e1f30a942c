#!/usr/bin/env bash
# Build the libFuzzer target (clang 14 + ASan + UBSan) and fuzz the GGUF reader and model loader.
#   tests/fuzz/run.sh [SECONDS] [WORKDIR]      (default 60 s, /tmp/minfer-fuzz)
# Needs Debian's clang-14 and libclang-rt-14-dev.  New inputs that find coverage go to WORKDIR/corpus;
# a crash writes WORKDIR/crash-*, which becomes a regression file in tests/fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
work=${2:-/tmp/minfer-fuzz}
mkdir -p "$work/corpus"
cp tests/fuzz/corpus/* "$work/corpus/"
src="csrc/common/error.cpp csrc/common/settings.cpp csrc/gguf/mapped_file.cpp csrc/gguf/gguf.cpp csrc/quant/types.cpp csrc/quant/dot_ref.cpp
     csrc/quant/quantize.cpp csrc/quant/swiglu.cpp
     csrc/quant/dispatch.cpp csrc/runtime/weights.cpp csrc/graph/ir.cpp csrc/models/*.cpp"
clang++-14 -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
    -o "$work/gguf_fuzz" tests/fuzz/gguf_fuzz.cpp $src
cd "$work"
./gguf_fuzz -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 corpus
