#include "backends/cpu/ops.h"

#include <cmath>
#include <functional>
#include <vector>

namespace minfer {

namespace {

// Row-parallel helper: small ops (a decode step's few thousand values) run on
// the calling thread, where waking the pool would cost more than the work.
void for_rows(int64_t rows, int64_t cols, ThreadPool& pool, const std::function<void(int64_t)>& f) {
    if (rows * cols < (1 << 15) || rows == 1) {
        for (int64_t r = 0; r < rows; r++) f(r);
        return;
    }
    pool.parallel_for(rows, [&](int64_t r, int) { f(r); });
}

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

}  // namespace

void cpu_rmsnorm(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows, int64_t n_groups,
                 int64_t width, const float* w, float eps, ThreadPool& pool) {
    for_rows(rows, n_groups * width, pool, [&](int64_t r) {
        for (int64_t g = 0; g < n_groups; g++) {
            const float* xr = x + r * x_ld + g * width;
            float* yr = y + r * y_ld + g * width;
            double ss = 0.0;  // the sum of squares in double, as ggml does
            for (int64_t i = 0; i < width; i++) ss += double(xr[i]) * double(xr[i]);
            const float scale = float(1.0 / std::sqrt(ss / double(width) + double(eps)));
            for (int64_t i = 0; i < width; i++) yr[i] = xr[i] * scale * w[i];
        }
    });
}

void cpu_rope(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows, int n_head, int head_dim,
              int rope_dim, float base, float scale, bool neox, const int32_t* pos, ThreadPool& pool) {
    const int half = rope_dim / 2;
    std::vector<double> inv_freq((size_t)(half));
    for (int i = 0; i < half; i++) inv_freq[size_t(i)] = std::pow(double(base), -2.0 * i / rope_dim);
    for_rows(rows, int64_t(n_head) * head_dim, pool, [&](int64_t r) {
        std::vector<float> c((size_t)(half)), s((size_t)(half));
        for (int i = 0; i < half; i++) {
            double theta = double(pos[r]) * double(scale) * inv_freq[size_t(i)];
            c[size_t(i)] = float(std::cos(theta));
            s[size_t(i)] = float(std::sin(theta));
        }
        for (int h = 0; h < n_head; h++) {
            const float* xh = x + r * x_ld + int64_t(h) * head_dim;
            float* yh = y + r * y_ld + int64_t(h) * head_dim;
            for (int i = 0; i < half; i++) {
                int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                float a = xh[i0], b = xh[i1];
                yh[i0] = a * c[size_t(i)] - b * s[size_t(i)];
                yh[i1] = a * s[size_t(i)] + b * c[size_t(i)];
            }
            if (yh != xh)
                for (int i = rope_dim; i < head_dim; i++) yh[i] = xh[i];
        }
    });
}

void cpu_elementwise(Elementwise f, const float* a, int64_t a_ld, const float* b, int64_t b_ld, float* y,
                     int64_t y_ld, int64_t rows, int64_t cols, ThreadPool& pool, const DotKernels& kernels,
                     float s) {
    for_rows(rows, cols, pool, [&](int64_t r) {
        const float* ar = a + r * a_ld;
        const float* br = b ? b + r * b_ld : nullptr;
        float* yr = y + r * y_ld;
        switch (f) {
            case Elementwise::Add: for (int64_t i = 0; i < cols; i++) yr[i] = ar[i] + br[i]; break;
            case Elementwise::Mul: for (int64_t i = 0; i < cols; i++) yr[i] = ar[i] * br[i]; break;
            case Elementwise::Silu: for (int64_t i = 0; i < cols; i++) yr[i] = silu(ar[i]); break;
            case Elementwise::SwiGLU: kernels.swiglu(ar, br, yr, cols); break;
            case Elementwise::GeGLU: kernels.geglu(ar, br, yr, cols); break;
            case Elementwise::Gelu: {  // the gate's kernel times a row of ones
                thread_local std::vector<float> ones;
                ones.resize(size_t(cols), 1.0f);
                kernels.geglu(ar, ones.data(), yr, cols);
                break;
            }
            case Elementwise::Scale: for (int64_t i = 0; i < cols; i++) yr[i] = ar[i] * s; break;
            case Elementwise::SoftCap: for (int64_t i = 0; i < cols; i++) yr[i] = s * std::tanh(ar[i] / s); break;
        }
    });
}

}  // namespace minfer
