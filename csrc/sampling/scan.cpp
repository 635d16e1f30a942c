#include "sampling/scan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace minfer {

int first_nan_ref(const float* x, int n) {
    for (int i = 0; i < n; i++)
        if (std::isnan(x[i])) return i;
    return -1;
}

int first_argmax_ref(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

int first_argmax_allowed(const float* x, int n, const uint32_t* allow) {
    int best = -1;
    float m = -INFINITY;
    for (int w = 0; w * 32 < n; w++) {
        uint32_t bits = allow[w];
        const int base = w * 32, end = std::min(n, base + 32);
        if (end - base < 32) bits &= (1u << (end - base)) - 1u;  // bits past the vocabulary never win
        if (bits == ~0u) {
            const int i = base + first_argmax(x + base, 32);
            if (best < 0 || x[i] > m) best = i, m = x[i];
            continue;
        }
        for (; bits; bits &= bits - 1) {
            const int i = base + __builtin_ctz(bits);
            if (best < 0 || x[i] > m) best = i, m = x[i];
        }
    }
    return best;
}

bool any_allowed(const uint32_t* allow, int n) {
    for (int w = 0; w * 32 < n; w++) {
        const int left = n - w * 32;
        if (allow[w] & (left >= 32 ? ~0u : (1u << left) - 1u)) return true;
    }
    return false;
}

int mask_disallowed(float* x, int n, const uint32_t* allow) {
    int allowed = 0;
    for (int w = 0; w * 32 < n; w++) {
        const uint32_t bits = allow[w];
        const int base = w * 32, end = std::min(n, base + 32);
        if (bits == ~0u && end - base == 32) {
            allowed += 32;
            continue;
        }
        for (int i = base; i < end; i++) {
            if ((bits >> (i - base)) & 1u)
                allowed++;
            else
                x[i] = -INFINITY;
        }
    }
    return allowed;
}

#if defined(__AVX2__)
int first_nan(const float* x, int n) {
    int i = 0;
    // 32 values a step: any NaN among them sets a lane of the unordered compare; the scalar loop then names it
    for (; i + 32 <= n; i += 32) {
        __m256 u = _mm256_setzero_ps();
        for (int k = 0; k < 32; k += 8) {
            const __m256 v = _mm256_loadu_ps(x + i + k);
            u = _mm256_or_ps(u, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        if (!_mm256_testz_ps(u, u)) break;
    }
    const int r = first_nan_ref(x + i, n - i);
    return r < 0 ? -1 : i + r;
}

int first_argmax(const float* x, int n) {
    // the maximum value (exact: vmaxps of NaN-free values is one of them), then its first position,
    // which is what std::max_element returns (0.0 and -0.0 compare equal in both)
    int i = 0;
    float m = x[0];
    if (n >= 32) {
        __m256 a = _mm256_loadu_ps(x), b = a, c = a, d = a;
        for (; i + 32 <= n; i += 32) {
            a = _mm256_max_ps(a, _mm256_loadu_ps(x + i));
            b = _mm256_max_ps(b, _mm256_loadu_ps(x + i + 8));
            c = _mm256_max_ps(c, _mm256_loadu_ps(x + i + 16));
            d = _mm256_max_ps(d, _mm256_loadu_ps(x + i + 24));
        }
        alignas(32) float t[8];
        _mm256_store_ps(t, _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d)));
        for (float v : t) m = std::max(m, v);
    }
    for (; i < n; i++) m = std::max(m, x[i]);
    const __m256 mv = _mm256_set1_ps(m);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), mv, _CMP_EQ_OQ));
        if (hit) return j + __builtin_ctz(unsigned(hit));
    }
    for (; j < n; j++)
        if (x[j] == m) return j;
    return 0;  // unreachable for NaN-free input
}
#else
int first_nan(const float* x, int n) { return first_nan_ref(x, n); }
int first_argmax(const float* x, int n) { return first_argmax_ref(x, n); }
#endif

void top_k(const float* x, int n, int k, std::vector<int>& out) {
    const ByLogit better{x};
    out.resize(size_t(k));
    std::iota(out.begin(), out.end(), 0);
    std::make_heap(out.begin(), out.end(), better);
    float worst = x[out.front()];  // a later token (higher id) enters only above it
    for (int i = k; i < n;) {
        if (i + 16 <= n) {
            float m[4] = {x[i], x[i + 1], x[i + 2], x[i + 3]};
            for (int j = 4; j < 16; j += 4)
                for (int q = 0; q < 4; q++) m[q] = x[i + j + q] > m[q] ? x[i + j + q] : m[q];
            if (!(m[0] > worst || m[1] > worst || m[2] > worst || m[3] > worst)) {
                i += 16;
                continue;
            }
        }
        for (const int e = std::min(n, i + 16); i < e; i++)
            if (x[i] > worst) {
                std::pop_heap(out.begin(), out.end(), better);
                out.back() = i;
                std::push_heap(out.begin(), out.end(), better);
                worst = x[out.front()];
            }
    }
    std::sort(out.begin(), out.end(), better);
}

}  // namespace minfer
