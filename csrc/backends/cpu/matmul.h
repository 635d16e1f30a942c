// Quantized matrix products on the CPU:  Y = X W^T.
//
//   W  [rows, cols]   weight rows in their GGUF block type (row stride = row_size)
//   X  [n_tok, cols]  f32 activations (row stride x_ld)
//   Y  [n_tok, rows]  f32, written at y[t * y_ld + r]
//
// X is first quantized row by row to the weight type's activation type
// (vec_dot_type), then every (row, token) pair is one dot product from the
// chosen ISA's kernel table.  Work is split into tiles of weight rows x tokens
// so that a tile's weight rows stay in cache while they meet every token of the
// tile (the matrix-vector case is n_tok = 1).  Several weights that read the
// same X (q/k/v, gate/up) go in one call: X is quantized once per activation
// type and all their tiles share one parallel_for.
#pragma once
#include <cstdint>

#include "quant/quant.h"
#include "runtime/thread_pool.h"

namespace minfer {

struct MatJob {
    const void* w;      // weight rows
    uint32_t type;
    int64_t rows;
    float* y;           // output: y[t * y_ld + r]
    int64_t y_ld;
};

void matmul_jobs(const MatJob* jobs, int n_jobs, int64_t cols, const float* x, int64_t x_ld, int64_t n_tok,
                 ThreadPool& pool, const DotKernels& kernels);

// One weight, contiguous X and Y.
void matmul(const void* w, uint32_t type, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
            float* y, ThreadPool& pool, const DotKernels& kernels);

// The plain definition: dequantize each weight row and dot it in float64 with
// the *quantized-then-dequantized* activations.  Slow; for tests.
void matmul_ref(const void* w, uint32_t type, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
                float* y);

}  // namespace minfer
