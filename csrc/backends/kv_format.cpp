#include "backends/kv_format.h"

#include <cstring>
#include <vector>
#if defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "common/error.h"
#include "common/half.h"
#include "quant/quant.h"

namespace minfer {

namespace {
// f16 -> f32 by table: attention converts every cached key and value it reads.
const float* f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t h = 0; h < 65536; h++) t[h] = f16_to_f32(uint16_t(h));
        return t;
    }();
    return table.data();
}
}  // namespace

size_t kv_row_bytes(uint32_t kv_type, int64_t dim) {
    switch (kv_type) {
        case GGML_TYPE_F32: return size_t(dim) * 4;
        case GGML_TYPE_F16: return size_t(dim) * 2;
        case GGML_TYPE_Q8_0:
            if (dim % QK8_0) throw MinferError(strfmt("q8_0 KV cache needs a KV width divisible by 32, got %lld", (long long)dim));
            return row_size(GGML_TYPE_Q8_0, dim);
        default:
            throw MinferError(strfmt("KV cache type %s is not supported (f32, f16, q8_0)", type_traits(kv_type).name));
    }
}

void kv_write_row(uint32_t kv_type, const float* x, void* row, int64_t dim) {
    switch (kv_type) {
        case GGML_TYPE_F32: std::memcpy(row, x, size_t(dim) * 4); return;
        case GGML_TYPE_F16: {
            uint16_t* h = (uint16_t*)row;
            for (int64_t i = 0; i < dim; i++) h[i] = f32_to_f16(x[i]);
            return;
        }
        default: quantize_row_act(GGML_TYPE_Q8_0, x, row, dim); return;
    }
}

void kv_read_row(uint32_t kv_type, const void* row, int64_t col, float* y, int64_t n) {
    switch (kv_type) {
        case GGML_TYPE_F32: std::memcpy(y, (const float*)row + col, size_t(n) * 4); return;
        case GGML_TYPE_F16: {
            const uint16_t* h = (const uint16_t*)row + col;
            int64_t i = 0;
#if defined(__F16C__) && defined(__FMA__)
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i))));
#endif
            const float* t = f16_table();
            for (; i < n; i++) y[i] = t[h[i]];
            return;
        }
        default:
            dequantize_row(GGML_TYPE_Q8_0, (const block_q8_0*)row + col / QK8_0, y, n);
            return;
    }
}

void axpy_f16(float a, const uint16_t* h, float* y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__) && defined(__FMA__)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, x, _mm256_loadu_ps(y + i)));
    }
#endif
    const float* t = f16_table();
    for (; i < n; i++) y[i] += a * t[h[i]];
}

void scores_f16(const float* q, const uint16_t* K, size_t stride, int nk, int head_dim, float scale, float* s) {
    int j = 0;
#if defined(__F16C__) && defined(__FMA__)
    if (head_dim % 8 == 0 && head_dim <= 128) {
        const int nv = head_dim / 8;
        __m256 qv[16];
        for (int v = 0; v < nv; v++) qv[v] = _mm256_loadu_ps(q + 8 * v);
        auto dot_row = [&](const uint16_t* k) {
            __m256 acc = _mm256_mul_ps(qv[0], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)k)));
            for (int v = 1; v < nv; v++)
                acc = _mm256_fmadd_ps(qv[v], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k + 8 * v))), acc);
            return acc;
        };
        for (; j + 4 <= nk; j += 4) {  // four keys, one combined horizontal sum
            __m256 a0 = dot_row(K + size_t(j) * stride), a1 = dot_row(K + size_t(j + 1) * stride);
            __m256 a2 = dot_row(K + size_t(j + 2) * stride), a3 = dot_row(K + size_t(j + 3) * stride);
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(s + j, _mm_mul_ps(r, _mm_set1_ps(scale)));
        }
    }
#endif
    const float* t = f16_table();
    for (; j < nk; j++) {
        const uint16_t* k = K + size_t(j) * stride;
        float acc = 0.0f;
        for (int d = 0; d < head_dim; d++) acc += q[d] * t[k[d]];
        s[j] = acc * scale;
    }
}

}  // namespace minfer
