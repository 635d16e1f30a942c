#include "backends/kv_format.h"

#include <cstring>
#include <vector>

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

void kv_read_f16_table(const uint16_t* h, float* y, int64_t n) {
    const float* t = f16_table();
    for (int64_t i = 0; i < n; i++) y[i] = t[h[i]];
}

void kv_read_row(uint32_t kv_type, const void* row, int64_t col, float* y, int64_t n) {
    switch (kv_type) {
        case GGML_TYPE_F32: std::memcpy(y, (const float*)row + col, size_t(n) * 4); return;
        case GGML_TYPE_F16: return kv_read_f16(row, col, y, n);
        default:
            dequantize_row(GGML_TYPE_Q8_0, (const block_q8_0*)row + col / QK8_0, y, n);
            return;
    }
}

}  // namespace minfer
