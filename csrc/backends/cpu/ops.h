// CPU kernels of the element-wise, normalization and position ops.  A matrix
// argument is (pointer, ld): element (r, c) at p[r * ld + c].  Outputs may be
// the inputs (in place).  Large ops are split over rows on the thread pool.
#pragma once
#include <cstdint>

#include "quant/quant.h"
#include "runtime/thread_pool.h"

namespace minfer {

// y = x / sqrt(mean(x^2) + eps) * w over groups of `width` values: each row has
// n_groups groups at columns g*width (n_groups = 1 for RmsNorm, n_head for QkNorm).
void cpu_rmsnorm(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows, int64_t n_groups,
                 int64_t width, const float* w, float eps, ThreadPool& pool);

// Rotary embedding of rows of n_head heads of head_dim values at positions pos[r];
// the first rope_dim values of each head rotate: neox pairs (i, i + rope_dim/2),
// normal pairs (2i, 2i + 1).
void cpu_rope(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows, int n_head, int head_dim,
              int rope_dim, float base, float scale, bool neox, const int32_t* pos, ThreadPool& pool);

enum class Elementwise { Add, Mul, Silu, SwiGLU, Gelu, GeGLU, Scale, SoftCap };
// y = f(a, b) (b unused for the unary ones); the gates (a the gate) by the ISA's row kernels; Scale: a * s,
// SoftCap: s tanh(a / s).
void cpu_elementwise(Elementwise f, const float* a, int64_t a_ld, const float* b, int64_t b_ld, float* y,
                     int64_t y_ld, int64_t rows, int64_t cols, ThreadPool& pool, const DotKernels& kernels,
                     float s = 1.0f);

}  // namespace minfer
