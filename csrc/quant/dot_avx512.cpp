// AVX-512 (F, BW, VL, VNNI) dot products: the shared x86 kernels with vpdpbusd
// for the int8 products, and 512-bit float dots.
#include <immintrin.h>

#include <cstring>

#include "common/error.h"
#include "common/exp_avx2.h"
#include "common/half.h"
#include "quant/quant.h"

namespace minfer {
namespace {
#define MINFER_VNNI 1
#include "quant/dot_x86.inc"

float dot_f32_f32_512(int64_t n, const void* vw, const void* va) {
    const float* w = (const float*)vw;
    const float* a = (const float*)va;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(a + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(a + i + 16), acc1);
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) sum += w[i] * a[i];
    return sum;
}

float dot_f16_f32_512(int64_t n, const void* vw, const void* va) {
    const uint16_t* w = (const uint16_t*)vw;
    const float* a = (const float*)va;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w + i)));
        __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(w + i + 16)));
        acc0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a + i), acc0);
        acc1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(a + i + 16), acc1);
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) sum += h2f(w[i]) * a[i];
    return sum;
}

float dot_bf16_f32_512(int64_t n, const void* vw, const void* va) {
    const uint16_t* w = (const uint16_t*)vw;
    const float* a = (const float*)va;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i wi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + i))), 16);
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(wi), _mm512_loadu_ps(a + i), acc);
    }
    float sum = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) sum += bf16_to_f32(w[i]) * a[i];
    return sum;
}

DotKernels make_table() {
    DotKernels t = make_x86_table(Isa::avx512);
    t.dot[GGML_TYPE_F32] = dot_f32_f32_512;
    t.dot[GGML_TYPE_F16] = dot_f16_f32_512;
    t.dot[GGML_TYPE_BF16] = dot_bf16_f32_512;
    return t;
}
}  // namespace

const DotKernels* dot_kernels_avx512() {
    static const DotKernels table = make_table();
    return &table;
}

}  // namespace minfer
