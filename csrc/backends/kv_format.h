// How one row of the KV cache is stored (F32, F16 or Q8_0 blocks), shared by
// every host backend so that what one writes the other can read.
#pragma once
#include <cstddef>
#include <cstdint>

namespace minfer {

// Bytes of one KV row of `dim` values; throws for unsupported types.
size_t kv_row_bytes(uint32_t kv_type, int64_t dim);
void kv_write_row(uint32_t kv_type, const float* x, void* row, int64_t dim);
// Values [col, col + n) of a stored row (col and n multiples of 32 for Q8_0).
void kv_read_row(uint32_t kv_type, const void* row, int64_t col, float* y, int64_t n);
// y[0..n) += a * h[0..n) for f16 h: attention's weighted sum over cached values,
// read in place (F16C when the build targets it, else a table).
void axpy_f16(float a, const uint16_t* h, float* y, int64_t n);
// s[j] = scale * dot(q, K row j) for j < nk over f16 rows `stride` values apart
// (decode attention's scores; F16C with q held in registers where built for it).
void scores_f16(const float* q, const uint16_t* K, size_t stride, int nk, int head_dim, float scale, float* s);

}  // namespace minfer
