#include "backends/cpu/matmul.h"

#include <vector>

#include "common/error.h"

namespace minfer {

namespace {

void check_shapes(uint32_t type, int64_t rows, int64_t cols, int64_t n_tok, const DotKernels* kernels) {
    const TypeTraits& t = type_traits(type);
    if (!t.known) throw MinferError(strfmt("matmul: unknown weight type id %u", type));
    if (kernels && !kernels->dot[type])
        throw MinferError(strfmt("matmul: weight type %s has no %s kernel", t.name, isa_name(kernels->isa)));
    if (rows < 0 || n_tok < 0 || cols <= 0)
        throw MinferError(strfmt("matmul: bad shape rows=%lld cols=%lld n_tok=%lld", (long long)rows,
                                 (long long)cols, (long long)n_tok));
    const TypeTraits& a = type_traits(vec_dot_type(type));
    if (cols % t.block_size != 0 || cols % a.block_size != 0)
        throw MinferError(strfmt("matmul: %lld columns is not a multiple of the %s block (%d) / %s block (%d)",
                                 (long long)cols, t.name, t.block_size, a.name, a.block_size));
}

}  // namespace

void matmul(const void* w, uint32_t type, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
            float* y, ThreadPool& pool, const DotKernels& kernels) {
    check_shapes(type, rows, cols, n_tok, &kernels);
    if (rows == 0 || n_tok == 0) return;
    const uint32_t act_type = vec_dot_type(type);
    const size_t w_row = row_size(type, cols);
    const size_t a_row = row_size(act_type, cols);

    // Activations in the dot kernels' format (f32 activations are used in place).
    std::vector<uint8_t> act_buf;
    const uint8_t* act = (const uint8_t*)x;
    if (act_type != GGML_TYPE_F32) {
        act_buf.resize(a_row * size_t(n_tok));
        pool.parallel_for(n_tok, [&](int64_t t, int) {
            quantize_row_act(act_type, x + t * cols, act_buf.data() + size_t(t) * a_row, cols);
        });
        act = act_buf.data();
    }

    // Tiles: kRows weight rows x kTok tokens.  Small enough that a tile's rows
    // fit in L2 for the 1.5B model's widest rows, enough tiles to balance threads.
    constexpr int64_t kRows = 16, kTok = 16;
    const int64_t row_tiles = (rows + kRows - 1) / kRows, tok_tiles = (n_tok + kTok - 1) / kTok;
    const vec_dot_fn dot = kernels.dot[type];
    const uint8_t* wb = (const uint8_t*)w;
    pool.parallel_for(row_tiles * tok_tiles, [&](int64_t task, int) {
        int64_t r0 = (task % row_tiles) * kRows, t0 = (task / row_tiles) * kTok;
        int64_t r1 = r0 + kRows < rows ? r0 + kRows : rows, t1 = t0 + kTok < n_tok ? t0 + kTok : n_tok;
        for (int64_t t = t0; t < t1; t++) {
            const uint8_t* a = act + size_t(t) * a_row;
            float* yt = y + t * rows;
            for (int64_t r = r0; r < r1; r++) yt[r] = dot(cols, wb + size_t(r) * w_row, a);
        }
    });
}

void matmul_ref(const void* w, uint32_t type, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
                float* y) {
    check_shapes(type, rows, cols, n_tok, nullptr);
    const uint32_t act_type = vec_dot_type(type);
    const size_t w_row = row_size(type, cols);
    std::vector<uint8_t> aq(row_size(act_type, cols));
    std::vector<float> a((size_t)cols), wr((size_t)cols);
    for (int64_t t = 0; t < n_tok; t++) {
        quantize_row_act(act_type, x + t * cols, aq.data(), cols);
        dequantize_row(act_type, aq.data(), a.data(), cols);
        for (int64_t r = 0; r < rows; r++) {
            dequantize_row(type, (const uint8_t*)w + size_t(r) * w_row, wr.data(), cols);
            double s = 0.0;
            for (int64_t i = 0; i < cols; i++) s += double(wr[size_t(i)]) * double(a[size_t(i)]);
            y[t * rows + r] = float(s);
        }
    }
}

}  // namespace minfer
