// The FFN gate's reference: y = silu(g) * u = g u / (1 + e^-g), with the C
// library's exp.  The SIMD tables carry their own (swiglu_x86.inc).
#include <cmath>

#include "quant/quant.h"

namespace minfer {

void swiglu_row_ref(const float* g, const float* u, float* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace minfer
