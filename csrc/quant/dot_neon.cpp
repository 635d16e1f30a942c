// ARM NEON dot products (AArch64 with the dot-product extension, vdotq_s32).
// Same contract as the x86 kernels (dot_x86.inc): the integers of each block are
// exactly those of the scalar reference (dot_ref.cpp); the K-quants do their
// float part per super-block in the reference's order (bit-identical results);
// the 32-value types keep float partial sums in a vector.
#include <arm_neon.h>

#include <cstring>

#include "common/half.h"
#include "quant/quant.h"

namespace minfer {
namespace {

inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

// Sum of a[0..16) * b[0..16) as one int.
inline int dot16_sum(int8x16_t a, int8x16_t b) { return vaddvq_s32(vdotq_s32(vdupq_n_s32(0), a, b)); }

// 16 packed bytes -> low nibbles (values 0..15 of a 32-block) and high nibbles (16..31).
inline void nibbles(const uint8_t* p, int8x16_t* lo, int8x16_t* hi) {
    uint8x16_t b = vld1q_u8(p);
    *lo = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0f)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
}

// 16 bits -> 16 bytes, 0x10 where the bit is set (the 5th bit of Q5_0/Q5_1 values).
inline int8x16_t bit4_bytes(uint32_t bits16) {
    static const uint8_t m[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8(uint8_t(bits16)), vdup_n_u8(uint8_t(bits16 >> 8)));
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(v, vld1q_u8(m)), vdupq_n_u8(0x10)));
}

inline uint32_t load_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

// ---- 32-value blocks ---------------------------------------------------------

float dot_q4_0_q8_0(int64_t n, const void* vw, const void* va) {
    const block_q4_0* w = (const block_q4_0*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int8x16_t lo, hi;
        nibbles(w[i].qs, &lo, &hi);
        int32x4_t p = dot16(dot16(vdupq_n_s32(0), vsubq_s8(lo, eight), vld1q_s8(a[i].qs)), vsubq_s8(hi, eight),
                            vld1q_s8(a[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
    }
    return vaddvq_f32(acc);
}

float dot_q4_1_q8_1(int64_t n, const void* vw, const void* va) {
    const block_q4_1* w = (const block_q4_1*)vw;
    const block_q8_1* a = (const block_q8_1*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    float mins = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        int8x16_t lo, hi;
        nibbles(w[i].qs, &lo, &hi);
        int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs)), hi, vld1q_s8(a[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
        mins += f16_to_f32(w[i].m) * f16_to_f32(a[i].s);
    }
    return vaddvq_f32(acc) + mins;
}

float dot_q5_0_q8_0(int64_t n, const void* vw, const void* va) {
    const block_q5_0* w = (const block_q5_0*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    const int8x16_t sixteen = vdupq_n_s8(16);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        uint32_t qh = load_u32(w[i].qh);
        int8x16_t lo, hi;
        nibbles(w[i].qs, &lo, &hi);
        lo = vsubq_s8(vorrq_s8(lo, bit4_bytes(qh & 0xffff)), sixteen);
        hi = vsubq_s8(vorrq_s8(hi, bit4_bytes(qh >> 16)), sixteen);
        int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs)), hi, vld1q_s8(a[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
    }
    return vaddvq_f32(acc);
}

float dot_q5_1_q8_1(int64_t n, const void* vw, const void* va) {
    const block_q5_1* w = (const block_q5_1*)vw;
    const block_q8_1* a = (const block_q8_1*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    float mins = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        uint32_t qh = load_u32(w[i].qh);
        int8x16_t lo, hi;
        nibbles(w[i].qs, &lo, &hi);
        lo = vorrq_s8(lo, bit4_bytes(qh & 0xffff));
        hi = vorrq_s8(hi, bit4_bytes(qh >> 16));
        int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs)), hi, vld1q_s8(a[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
        mins += f16_to_f32(w[i].m) * f16_to_f32(a[i].s);
    }
    return vaddvq_f32(acc) + mins;
}

float dot_q8_0_q8_0(int64_t n, const void* vw, const void* va) {
    const block_q8_0* w = (const block_q8_0*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int32x4_t p = dot16(dot16(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(a[i].qs)), vld1q_s8(w[i].qs + 16),
                            vld1q_s8(a[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
    }
    return vaddvq_f32(acc);
}

// ---- K-quants x Q8_K -------------------------------------------------------------
// Each helper below produces, for one 32-value run of the super-block, two
// 16-byte vectors of unsigned quants (values 0..15 and 16..31 of the run).

float dot_q2_K_q8_K(int64_t n, const void* vw, const void* va) {
    const block_q2_K* w = (const block_q2_K*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) summ += (w[i].scales[j] >> 4) * a[i].bsums[j];
        for (int h = 0; h < 2; h++) {
            uint8x16_t q0 = vld1q_u8(w[i].qs + 32 * h), q1 = vld1q_u8(w[i].qs + 32 * h + 16);
            for (int s = 0; s < 4; s++) {
                const int8_t* y = a[i].qs + 128 * h + 32 * s;
                const int j = 8 * h + 2 * s;
                uint8x16_t sh = vdupq_n_u8(uint8_t(-2 * s));  // vshlq with a negative count shifts right
                int8x16_t v0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, vreinterpretq_s8_u8(sh)), vdupq_n_u8(3)));
                int8x16_t v1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, vreinterpretq_s8_u8(sh)), vdupq_n_u8(3)));
                sumi += (w[i].scales[j] & 0xf) * dot16_sum(v0, vld1q_s8(y)) +
                        (w[i].scales[j + 1] & 0xf) * dot16_sum(v1, vld1q_s8(y + 16));
            }
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
        int sc[16], offset = 0;
        for (int j = 0; j < 16; j++) {
            sc[j] = q3_K_scale(w[i].scales, j);
            offset += sc[j] * a[i].bsums[j];
        }
        // q = q2 + 4*hbit - 4: dot the unsigned q2 + 4*hbit, subtract 4 * scale * bsums
        uint8x16_t m0 = vld1q_u8(w[i].hmask), m1 = vld1q_u8(w[i].hmask + 16);
        int sumi = 0;
        for (int h = 0; h < 2; h++) {
            uint8x16_t q0 = vld1q_u8(w[i].qs + 32 * h), q1 = vld1q_u8(w[i].qs + 32 * h + 16);
            for (int s = 0; s < 4; s++) {
                const int8_t* y = a[i].qs + 128 * h + 32 * s;
                const int j = 8 * h + 2 * s;
                int8x16_t sh = vdupq_n_s8(int8_t(-2 * s)), hs = vdupq_n_s8(int8_t(-(4 * h + s)));
                uint8x16_t b0 = vshlq_n_u8(vandq_u8(vshlq_u8(m0, hs), vdupq_n_u8(1)), 2);
                uint8x16_t b1 = vshlq_n_u8(vandq_u8(vshlq_u8(m1, hs), vdupq_n_u8(1)), 2);
                int8x16_t v0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(vshlq_u8(q0, sh), vdupq_n_u8(3)), b0));
                int8x16_t v1 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(vshlq_u8(q1, sh), vdupq_n_u8(3)), b1));
                sumi += sc[j] * dot16_sum(v0, vld1q_s8(y)) + sc[j + 1] * dot16_sum(v1, vld1q_s8(y + 16));
            }
        }
        sumi -= 4 * offset;
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
        for (int c = 0; c < 4; c++) {
            int sc0, m0, sc1, m1;
            k_scale_min(w[i].scales, 2 * c, &sc0, &m0);
            k_scale_min(w[i].scales, 2 * c + 1, &sc1, &m1);
            summ += m0 * (a[i].bsums[4 * c] + a[i].bsums[4 * c + 1]) + m1 * (a[i].bsums[4 * c + 2] + a[i].bsums[4 * c + 3]);
            const int8_t* y = a[i].qs + 64 * c;
            uint8x16_t b0 = vld1q_u8(w[i].qs + 32 * c), b1 = vld1q_u8(w[i].qs + 32 * c + 16);
            int8x16_t l0 = vreinterpretq_s8_u8(vandq_u8(b0, vdupq_n_u8(0x0f)));
            int8x16_t l1 = vreinterpretq_s8_u8(vandq_u8(b1, vdupq_n_u8(0x0f)));
            int8x16_t h0 = vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), h1 = vreinterpretq_s8_u8(vshrq_n_u8(b1, 4));
            int32x4_t lo = dot16(dot16(vdupq_n_s32(0), l0, vld1q_s8(y)), l1, vld1q_s8(y + 16));
            int32x4_t hi = dot16(dot16(vdupq_n_s32(0), h0, vld1q_s8(y + 32)), h1, vld1q_s8(y + 48));
            sumi += sc0 * vaddvq_s32(lo) + sc1 * vaddvq_s32(hi);
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
        uint8x16_t qh0 = vld1q_u8(w[i].qh), qh1 = vld1q_u8(w[i].qh + 16);
        for (int c = 0; c < 4; c++) {
            int sc0, m0, sc1, m1;
            k_scale_min(w[i].scales, 2 * c, &sc0, &m0);
            k_scale_min(w[i].scales, 2 * c + 1, &sc1, &m1);
            summ += m0 * (a[i].bsums[4 * c] + a[i].bsums[4 * c + 1]) + m1 * (a[i].bsums[4 * c + 2] + a[i].bsums[4 * c + 3]);
            const int8_t* y = a[i].qs + 64 * c;
            uint8x16_t b0 = vld1q_u8(w[i].qs + 32 * c), b1 = vld1q_u8(w[i].qs + 32 * c + 16);
            // bit (2c) of qh gives the 5th bit of the low-nibble run, bit (2c+1) of the high one
            int8x16_t s_lo = vdupq_n_s8(int8_t(-2 * c)), s_hi = vdupq_n_s8(int8_t(-(2 * c + 1)));
            uint8x16_t one = vdupq_n_u8(1);
            int8x16_t l0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b0, vdupq_n_u8(0x0f)), vshlq_n_u8(vandq_u8(vshlq_u8(qh0, s_lo), one), 4)));
            int8x16_t l1 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b1, vdupq_n_u8(0x0f)), vshlq_n_u8(vandq_u8(vshlq_u8(qh1, s_lo), one), 4)));
            int8x16_t h0 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b0, 4), vshlq_n_u8(vandq_u8(vshlq_u8(qh0, s_hi), one), 4)));
            int8x16_t h1 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b1, 4), vshlq_n_u8(vandq_u8(vshlq_u8(qh1, s_hi), one), 4)));
            int32x4_t lo = dot16(dot16(vdupq_n_s32(0), l0, vld1q_s8(y)), l1, vld1q_s8(y + 16));
            int32x4_t hi = dot16(dot16(vdupq_n_s32(0), h0, vld1q_s8(y + 32)), h1, vld1q_s8(y + 48));
            sumi += sc0 * vaddvq_s32(lo) + sc1 * vaddvq_s32(hi);
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
        const int8_t* sc = w[i].scales;
        int offset = 0, sumi = 0;
        for (int j = 0; j < 16; j++) offset += sc[j] * a[i].bsums[j];
        for (int h = 0; h < 2; h++) {
            for (int k = 0; k < 4; k++) {
                // 32 values: low 4 bits from ql[64h + 32(k%2) ..] nibble k/2, high 2 bits from qh[32h ..] bits 2k
                const uint8_t* ql = w[i].ql + 64 * h + 32 * (k % 2);
                uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
                if (k / 2) {
                    l0 = vshrq_n_u8(l0, 4);
                    l1 = vshrq_n_u8(l1, 4);
                } else {
                    l0 = vandq_u8(l0, vdupq_n_u8(0x0f));
                    l1 = vandq_u8(l1, vdupq_n_u8(0x0f));
                }
                int8x16_t shift = vdupq_n_s8(int8_t(-2 * k));
                uint8x16_t h0 = vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(w[i].qh + 32 * h), shift), vdupq_n_u8(3)), 4);
                uint8x16_t h1 = vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(w[i].qh + 32 * h + 16), shift), vdupq_n_u8(3)), 4);
                const int8_t* y = a[i].qs + 128 * h + 32 * k;
                const int j = 8 * h + 2 * k;
                sumi += sc[j] * dot16_sum(vreinterpretq_s8_u8(vorrq_u8(l0, h0)), vld1q_s8(y)) +
                        sc[j + 1] * dot16_sum(vreinterpretq_s8_u8(vorrq_u8(l1, h1)), vld1q_s8(y + 16));
            }
        }
        sumi -= 32 * offset;
        sum += (f16_to_f32(w[i].d) * a[i].d) * float(sumi);
    }
    return sum;
}

// ---- IQ4_NL x Q8_0, IQ4_XS x Q8_K -----------------------------------------------

// 16 packed bytes -> the signed levels their low (values 0..15) and high (16..31) nibbles index.
inline void iq4_levels(const uint8_t* p, int8x16_t* lo, int8x16_t* hi) {
    const int8x16_t table = vld1q_s8(kvalues_iq4nl);
    int8x16_t l, h;
    nibbles(p, &l, &h);
    *lo = vqtbl1q_s8(table, vreinterpretq_u8_s8(l));
    *hi = vqtbl1q_s8(table, vreinterpretq_u8_s8(h));
}

float dot_iq4_nl_q8_0(int64_t n, const void* vw, const void* va) {
    const block_iq4_nl* w = (const block_iq4_nl*)vw;
    const block_q8_0* a = (const block_q8_0*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int8x16_t lo, hi;
        iq4_levels(w[i].qs, &lo, &hi);
        int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs)), hi, vld1q_s8(a[i].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p), f16_to_f32(w[i].d) * f16_to_f32(a[i].d));
    }
    return vaddvq_f32(acc);
}

// The reference's integers and float steps per super-block: the same bits.
float dot_iq4_xs_q8_K(int64_t n, const void* vw, const void* va) {
    const block_iq4_xs* w = (const block_iq4_xs*)vw;
    const block_q8_K* a = (const block_q8_K*)va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < 8; j++) {
            int8x16_t lo, hi;
            iq4_levels(w[i].qs + 16 * j, &lo, &hi);
            const int8_t* y = a[i].qs + 32 * j;
            sumi += iq4_xs_scale(w[i], j) * vaddvq_s32(dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(y)), hi, vld1q_s8(y + 16)));
        }
        sum += (f16_to_f32(w[i].d) * a[i].d) * float(sumi);
    }
    return sum;
}

// ---- float weights ----------------------------------------------------------------

float dot_f32_f32(int64_t n, const void* vw, const void* va) {
    const float* w = (const float*)vw;
    const float* a = (const float*)va;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(w + i), vld1q_f32(a + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(w + i + 4), vld1q_f32(a + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) sum += w[i] * a[i];
    return sum;
}

float dot_f16_f32(int64_t n, const void* vw, const void* va) {
    const uint16_t* w = (const uint16_t*)vw;
    const float* a = (const float*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        acc = vfmaq_f32(acc, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w + i))), vld1q_f32(a + i));
    float sum = vaddvq_f32(acc);
    for (; i < n; i++) sum += f16_to_f32(w[i]) * a[i];
    return sum;
}

float dot_bf16_f32(int64_t n, const void* vw, const void* va) {
    const uint16_t* w = (const uint16_t*)vw;
    const float* a = (const float*)va;
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        acc = vfmaq_f32(acc, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(w + i), 16)), vld1q_f32(a + i));
    float sum = vaddvq_f32(acc);
    for (; i < n; i++) sum += bf16_to_f32(w[i]) * a[i];
    return sum;
}

DotKernels make_table() {
    return make_dot_table(Isa::neon, MINFER_DOT_FNS);
}

}  // namespace

const DotKernels* dot_kernels_neon() {
    static const DotKernels table = make_table();
    return &table;
}

}  // namespace minfer
