// The FFN gates' references: y = silu(g) * u = g u / (1 + e^-g) and y = gelu(g) * u = g u / (1 + e^-2z),
// with the C library's exp.  The SIMD tables carry their own (swiglu_x86.inc).
#include <cmath>

#include "quant/quant.h"

namespace minfer {

void swiglu_row_ref(const float* g, const float* u, float* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void geglu_row_ref(const float* g, const float* u, float* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float z2 = 1.5957691216f * g[i] * (1.0f + 0.044715f * g[i] * g[i]);  // 2 sqrt(2/pi) = 1.5957691216
        y[i] = g[i] / (1.0f + std::exp(-z2)) * u[i];
    }
}

}  // namespace minfer
