// Scalar reference dot products: weight row (its GGUF block type) x activation
// row (its vec_dot_type).  These define the result every SIMD kernel must give:
// the integer part of each block is exact, and the float part is
//   sum over blocks, in order, of  (d_w * d_a) * sumi  (+ the min/offset term),
// accumulated in one f32.  The SIMD kernels compute the same integers; they may
// group the float additions differently (partial sums in vector lanes), which
// is the only difference allowed (tests/test_dot.py bounds it).
#include <cstring>

#include "common/half.h"
#include "quant/quant.h"

namespace minfer {

namespace {

// ---- 32-value blocks --------------------------------------------------------

float dot_q4_0_q8_0(int64_t n, const void* vw, const void* va) {
    const block_q4_0* w = (const block_q4_0*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += (int(w[i].qs[j] & 0xf) - 8) * a[i].qs[j];
            sumi += (int(w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        }
        sum += f16_to_f32(w[i].d) * f16_to_f32(a[i].d) * float(sumi);
    }
    return sum;
}

float dot_q4_1_q8_1(int64_t n, const void* vw, const void* va) {
    const block_q4_1* w = (const block_q4_1*)vw;
    const block_q8_1* a = (const block_q8_1*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += int(w[i].qs[j] & 0xf) * a[i].qs[j];
            sumi += int(w[i].qs[j] >> 4) * a[i].qs[j + 16];
        }
        sum += f16_to_f32(w[i].d) * f16_to_f32(a[i].d) * float(sumi) + f16_to_f32(w[i].m) * f16_to_f32(a[i].s);
    }
    return sum;
}

static inline uint32_t load_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

float dot_q5_0_q8_0(int64_t n, const void* vw, const void* va) {
    const block_q5_0* w = (const block_q5_0*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        uint32_t qh = load_u32(w[i].qh);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (w[i].qs[j] & 0xf) | ((qh >> j) & 1) << 4;
            int hi = (w[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            sumi += (lo - 16) * a[i].qs[j] + (hi - 16) * a[i].qs[j + 16];
        }
        sum += f16_to_f32(w[i].d) * f16_to_f32(a[i].d) * float(sumi);
    }
    return sum;
}

float dot_q5_1_q8_1(int64_t n, const void* vw, const void* va) {
    const block_q5_1* w = (const block_q5_1*)vw;
    const block_q8_1* a = (const block_q8_1*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        uint32_t qh = load_u32(w[i].qh);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (w[i].qs[j] & 0xf) | ((qh >> j) & 1) << 4;
            int hi = (w[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            sumi += lo * a[i].qs[j] + hi * a[i].qs[j + 16];
        }
        sum += f16_to_f32(w[i].d) * f16_to_f32(a[i].d) * float(sumi) + f16_to_f32(w[i].m) * f16_to_f32(a[i].s);
    }
    return sum;
}

float dot_q8_0_q8_0(int64_t n, const void* vw, const void* va) {
    const block_q8_0* w = (const block_q8_0*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += w[i].qs[j] * a[i].qs[j];
        sum += f16_to_f32(w[i].d) * f16_to_f32(a[i].d) * float(sumi);
    }
    return sum;
}

float dot_iq4_nl_q8_0(int64_t n, const void* vw, const void* va) {
    const block_iq4_nl* w = (const block_iq4_nl*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += kvalues_iq4nl[w[i].qs[j] & 0xf] * a[i].qs[j];
            sumi += kvalues_iq4nl[w[i].qs[j] >> 4] * a[i].qs[j + 16];
        }
        sum += f16_to_f32(w[i].d) * f16_to_f32(a[i].d) * float(sumi);
    }
    return sum;
}

// ---- K-quants x Q8_K ----------------------------------------------------------
// Per super-block: sumi = sum_j scale_j * (q . a over sub-block j) exactly in
// int32, and the min/offset term from a's bsums; then
//   sum += (d_w * d_a) * sumi - (dmin_w * d_a) * summ.
// The SIMD kernels do this float part per super-block in the same order, so for
// the K-quants they match the reference bit for bit.

float dot_q2_K_q8_K(int64_t n, const void* vw, const void* va) {
    const block_q2_K* w = (const block_q2_K*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) summ += (w[i].scales[j] >> 4) * a[i].bsums[j];
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, half = e / 128, sh = (e / 32) % 4;
                s += ((w[i].qs[half * 32 + e % 32] >> (2 * sh)) & 3) * a[i].qs[e];
            }
            sumi += (w[i].scales[j] & 0xf) * s;
        }
        float d = f16_to_f32(w[i].d) * a[i].d, dmin = f16_to_f32(w[i].dmin) * a[i].d;
        sum += d * float(sumi) - dmin * float(summ);
    }
    return sum;
}

float dot_q3_K_q8_K(int64_t n, const void* vw, const void* va) {
    const block_q3_K* w = (const block_q3_K*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int sc = q3_K_scale(w[i].scales, j);
            int s = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, half = e / 128, sh = (e / 32) % 4;
                int q = (w[i].qs[half * 32 + e % 32] >> (2 * sh)) & 3;
                int hbit = (w[i].hmask[e % 32] >> (e / 32)) & 1;
                s += (q - (hbit ? 0 : 4)) * a[i].qs[e];
            }
            sumi += sc * s;
        }
        sum += (f16_to_f32(w[i].d) * a[i].d) * float(sumi);
    }
    return sum;
}

float dot_q4_K_q8_K(int64_t n, const void* vw, const void* va) {
    const block_q4_K* w = (const block_q4_K*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k_scale_min(w[i].scales, j, &sc, &m);
            summ += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
            const uint8_t* q = w[i].qs + 32 * (j / 2);
            int s = 0;
            for (int l = 0; l < 32; l++) s += ((q[l] >> (4 * (j % 2))) & 0xf) * a[i].qs[32 * j + l];
            sumi += sc * s;
        }
        float d = f16_to_f32(w[i].d) * a[i].d, dmin = f16_to_f32(w[i].dmin) * a[i].d;
        sum += d * float(sumi) - dmin * float(summ);
    }
    return sum;
}

float dot_q5_K_q8_K(int64_t n, const void* vw, const void* va) {
    const block_q5_K* w = (const block_q5_K*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k_scale_min(w[i].scales, j, &sc, &m);
            summ += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
            const uint8_t* q = w[i].qs + 32 * (j / 2);
            int s = 0;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> (4 * (j % 2))) & 0xf) | ((w[i].qh[l] >> j) & 1) << 4;
                s += v * a[i].qs[32 * j + l];
            }
            sumi += sc * s;
        }
        float d = f16_to_f32(w[i].d) * a[i].d, dmin = f16_to_f32(w[i].dmin) * a[i].d;
        sum += d * float(sumi) - dmin * float(summ);
    }
    return sum;
}

float dot_q6_K_q8_K(int64_t n, const void* vw, const void* va) {
    const block_q6_K* w = (const block_q6_K*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, half = e / 128, k = (e / 32) % 4, m = e % 32;
                int lo = (w[i].ql[half * 64 + (k % 2) * 32 + m] >> (4 * (k / 2))) & 0xf;
                int hi = (w[i].qh[half * 32 + m] >> (2 * k)) & 3;
                s += ((lo | hi << 4) - 32) * a[i].qs[e];
            }
            sumi += w[i].scales[j] * s;
        }
        sum += (f16_to_f32(w[i].d) * a[i].d) * float(sumi);
    }
    return sum;
}

// IQ4_XS: per super-block sumi = sum_j (ls_j - 32) * (q . a over sub-block j), then (d_w * d_a) * sumi.
float dot_iq4_xs_q8_K(int64_t n, const void* vw, const void* va) {
    const block_iq4_xs* w = (const block_iq4_xs*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t* q = w[i].qs + 16 * j;
            const int8_t* y = a[i].qs + 32 * j;
            int s = 0;
            for (int l = 0; l < 16; l++) s += kvalues_iq4nl[q[l] & 0xf] * y[l] + kvalues_iq4nl[q[l] >> 4] * y[l + 16];
            sumi += iq4_xs_scale(w[i], j) * s;
        }
        sum += (f16_to_f32(w[i].d) * a[i].d) * float(sumi);
    }
    return sum;
}

// ---- float weights x f32 activations ----------------------------------------

float dot_f32_f32(int64_t n, const void* vw, const void* va) {
    const float* w = (const float*)vw;
    const float* a = (const float*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += w[i] * a[i];
    return sum;
}

float dot_f16_f32(int64_t n, const void* vw, const void* va) {
    const uint16_t* w = (const uint16_t*)vw;
    const float* a = (const float*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += f16_to_f32(w[i]) * a[i];
    return sum;
}

float dot_bf16_f32(int64_t n, const void* vw, const void* va) {
    const uint16_t* w = (const uint16_t*)vw;
    const float* a = (const float*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += bf16_to_f32(w[i]) * a[i];
    return sum;
}

DotKernels make_table() {
    return make_dot_table(Isa::scalar, MINFER_DOT_FNS);
}

}  // namespace

const DotKernels* dot_kernels_scalar() {
    static const DotKernels table = make_table();
    return &table;
}

}  // namespace minfer
