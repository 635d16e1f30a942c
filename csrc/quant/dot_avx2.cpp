// AVX2 + FMA + F16C dot products (see dot_x86.inc).
#include <immintrin.h>

#include <cstring>

#include "common/exp_avx2.h"
#include "common/half.h"
#include "quant/quant.h"

namespace minfer {
namespace {
#define MINFER_VNNI 0
#include "quant/dot_x86.inc"
}  // namespace

const DotKernels* dot_kernels_avx2() {
    static const DotKernels table = make_x86_table(Isa::avx2);
    return &table;
}

}  // namespace minfer
