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

}  // namespace minfer
