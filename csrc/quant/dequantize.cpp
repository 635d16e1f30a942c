// Dequantization of every supported weight type: the definition of what each
// block means.  Written element by element, with the same float operations in
// the same order as ggml (and as the `gguf` Python package), so results are
// bit-identical to both.  Compiled with -ffp-contract=off: an FMA would round
// differently.
#include "quant/quant.h"

#include "common/error.h"
#include "common/half.h"

namespace minfer {

namespace {

void dequant_q4_0(const block_q4_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = d * float(int(b[i].qs[j] & 0xf) - 8);
            y[j + QK4_0 / 2] = d * float(int(b[i].qs[j] >> 4) - 8);
        }
    }
}

void dequant_q4_1(const block_q4_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = d * float(b[i].qs[j] & 0xf) + m;
            y[j + QK4_1 / 2] = d * float(b[i].qs[j] >> 4) + m;
        }
    }
}

static inline uint32_t load_u32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void dequant_q5_0(const block_q5_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        float d = f16_to_f32(b[i].d);
        uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            int lo = (b[i].qs[j] & 0xf) | ((qh >> j) & 1) << 4;
            int hi = (b[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * float(lo - 16);
            y[j + QK5_0 / 2] = d * float(hi - 16);
        }
    }
}

void dequant_q5_1(const block_q5_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            int lo = (b[i].qs[j] & 0xf) | ((qh >> j) & 1) << 4;
            int hi = (b[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * float(lo) + m;
            y[j + QK5_1 / 2] = d * float(hi) + m;
        }
    }
}

void dequant_q8_0(const block_q8_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = float(b[i].qs[j]) * d;
    }
}

void dequant_q2_K(const block_q2_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int e = 0; e < QK_K; e++) {
            // e = half*128 + shift*32 + l: byte half*32 + l, bits 2*shift
            int half = e / 128, s = (e / 32) % 4, l = e % 32;
            int q = (b[i].qs[half * 32 + l] >> (2 * s)) & 3;
            uint8_t sc = b[i].scales[e / 16];
            float dl = d * float(sc & 0xf), ml = dmin * float(sc >> 4);
            y[e] = dl * float(q) - ml;
        }
    }
}

void dequant_q3_K(const block_q3_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            int half = e / 128, s = (e / 32) % 4, l = e % 32;
            int q = (b[i].qs[half * 32 + l] >> (2 * s)) & 3;
            int hbit = (b[i].hmask[l] >> (e / 32)) & 1;
            float dl = d * float(q3_K_scale(b[i].scales, e / 16));
            y[e] = dl * float(q - (hbit ? 0 : 4));
        }
    }
}

void dequant_q4_K(const block_q4_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            k_scale_min(b[i].scales, j, &sc, &m);
            float dl = d * float(sc), ml = dmin * float(m);
            // sub-block j: bytes 32*(j/2).., low nibble for even j, high for odd
            const uint8_t* q = b[i].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> (4 * (j % 2))) & 0xf;
                y[32 * j + l] = dl * float(v) - ml;
            }
        }
    }
}

void dequant_q5_K(const block_q5_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            k_scale_min(b[i].scales, j, &sc, &m);
            float dl = d * float(sc), ml = dmin * float(m);
            const uint8_t* q = b[i].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> (4 * (j % 2))) & 0xf) | ((b[i].qh[l] >> j) & 1) << 4;
                y[32 * j + l] = dl * float(v) - ml;
            }
        }
    }
}

void dequant_q6_K(const block_q6_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            // e = half*128 + k*32 + m: low 4 bits in ql[half*64 + (k%2)*32 + m]
            // (nibble k/2), high 2 bits in qh[half*32 + m] (bits 2k)
            int half = e / 128, k = (e / 32) % 4, m = e % 32;
            int lo = (b[i].ql[half * 64 + (k % 2) * 32 + m] >> (4 * (k / 2))) & 0xf;
            int hi = (b[i].qh[half * 32 + m] >> (2 * k)) & 3;
            float dl = d * float(b[i].scales[e / 16]);
            y[e] = dl * float((lo | hi << 4) - 32);
        }
    }
}

void dequant_iq4_nl(const block_iq4_nl* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = d * float(kvalues_iq4nl[b[i].qs[j] & 0xf]);
            y[j + QK4_0 / 2] = d * float(kvalues_iq4nl[b[i].qs[j] >> 4]);
        }
    }
}

void dequant_iq4_xs(const block_iq4_xs* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK_K / 32; j++) {
            float dl = d * float(iq4_xs_scale(b[i], j));
            const uint8_t* q = b[i].qs + 16 * j;
            for (int l = 0; l < 16; l++) {
                y[32 * j + l] = dl * float(kvalues_iq4nl[q[l] & 0xf]);
                y[32 * j + l + 16] = dl * float(kvalues_iq4nl[q[l] >> 4]);
            }
        }
    }
}

}  // namespace

void dequantize_row(uint32_t type, const void* x, float* y, int64_t n) {
    const TypeTraits& t = type_traits(type);
    if (!t.known || n % t.block_size != 0)
        throw MinferError(strfmt("dequantize: type %s (id %u) with %lld values is not supported",
                                 t.name, type, (long long)n));
    int64_t nb = n / t.block_size;
    switch (type) {
        case GGML_TYPE_F32: { const float* s = (const float*)x; for (int64_t i = 0; i < n; i++) y[i] = s[i]; return; }
        case GGML_TYPE_F16: { const uint16_t* s = (const uint16_t*)x; for (int64_t i = 0; i < n; i++) y[i] = f16_to_f32(s[i]); return; }
        case GGML_TYPE_BF16: { const uint16_t* s = (const uint16_t*)x; for (int64_t i = 0; i < n; i++) y[i] = bf16_to_f32(s[i]); return; }
        case GGML_TYPE_Q4_0: return dequant_q4_0((const block_q4_0*)x, y, nb);
        case GGML_TYPE_Q4_1: return dequant_q4_1((const block_q4_1*)x, y, nb);
        case GGML_TYPE_Q5_0: return dequant_q5_0((const block_q5_0*)x, y, nb);
        case GGML_TYPE_Q5_1: return dequant_q5_1((const block_q5_1*)x, y, nb);
        case GGML_TYPE_Q8_0: return dequant_q8_0((const block_q8_0*)x, y, nb);
        case GGML_TYPE_Q2_K: return dequant_q2_K((const block_q2_K*)x, y, nb);
        case GGML_TYPE_Q3_K: return dequant_q3_K((const block_q3_K*)x, y, nb);
        case GGML_TYPE_Q4_K: return dequant_q4_K((const block_q4_K*)x, y, nb);
        case GGML_TYPE_Q5_K: return dequant_q5_K((const block_q5_K*)x, y, nb);
        case GGML_TYPE_Q6_K: return dequant_q6_K((const block_q6_K*)x, y, nb);
        case GGML_TYPE_IQ4_NL: return dequant_iq4_nl((const block_iq4_nl*)x, y, nb);
        case GGML_TYPE_IQ4_XS: return dequant_iq4_xs((const block_iq4_xs*)x, y, nb);
        case GGML_TYPE_Q8_1: {  // activation type
            const block_q8_1* b = (const block_q8_1*)x;
            for (int64_t i = 0; i < nb; i++)
                for (int j = 0; j < QK8_1; j++) y[i * QK8_1 + j] = float(b[i].qs[j]) * f16_to_f32(b[i].d);
            return;
        }
        case GGML_TYPE_Q8_K: {  // activation type
            const block_q8_K* b = (const block_q8_K*)x;
            for (int64_t i = 0; i < nb; i++)
                for (int j = 0; j < QK_K; j++) y[i * QK_K + j] = float(b[i].qs[j]) * b[i].d;
            return;
        }
        default:
            throw MinferError(strfmt("dequantize: tensor type %s (id %u) is not supported by minfer", t.name, type));
    }
}

}  // namespace minfer
