// How one row of the KV cache is stored (F32, F16 or Q8_0 blocks), shared by
// every host backend so that what one writes the other can read.
#pragma once
#include <cstddef>
#include <cstdint>
#if defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace minfer {

// Bytes of one KV row of `dim` values; throws for unsupported types.
size_t kv_row_bytes(uint32_t kv_type, int64_t dim);
void kv_write_row(uint32_t kv_type, const float* x, void* row, int64_t dim);
// Values [col, col + n) of a stored row (col and n multiples of 32 for Q8_0).
void kv_read_row(uint32_t kv_type, const void* row, int64_t col, float* y, int64_t n);

// kv_read_row for an f16 row, inline where F16C converts eight values an instruction: CPU attention
// converts one head's slice of every cached row, and a call per row cost a fifth of its time.
void kv_read_f16_table(const uint16_t* h, float* y, int64_t n);  // the scalar rest
inline void kv_read_f16(const void* row, int64_t col, float* y, int64_t n) {
    const uint16_t* h = (const uint16_t*)row + col;
    int64_t i = 0;
#if defined(__F16C__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i))));
#endif
    if (i < n) kv_read_f16_table(h + i, y + i, n - i);
}

}  // namespace minfer
