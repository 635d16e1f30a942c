// Reference quantizers for the 32-value block types and the activation
// quantizers.  The weight quantizers follow ggml's *_ref functions operation for
// operation (f32 arithmetic, truncation after +0.5/+8.5/+16.5, roundf for Q8_0)
// so their bytes equal `gguf.quants.quantize`.
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/half.h"
#include "quant/quant.h"

namespace minfer {

namespace {

// The signed value of largest magnitude (first one on ties), as numpy's argmax of |x|.
static inline float signed_absmax(const float* x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        float v = std::fabs(x[j]);
        if (v > amax) { amax = v; max = x[j]; }
    }
    return max;
}

static inline float inverse_or_zero(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

static inline void store_u32(uint8_t* p, uint32_t v) {
    p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); p[2] = uint8_t(v >> 16); p[3] = uint8_t(v >> 24);
}

void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        float d = signed_absmax(x, QK4_0) / -8.0f;
        float id = inverse_or_zero(d);
        y[i].d = f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int lo = int(x[j] * id + 8.5f), hi = int(x[j + QK4_0 / 2] * id + 8.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            y[i].qs[j] = uint8_t(lo | hi << 4);
        }
    }
}

void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < QK4_1; j++) { mn = std::fmin(mn, x[j]); mx = std::fmax(mx, x[j]); }
        float d = (mx - mn) / 15.0f;
        float id = inverse_or_zero(d);
        y[i].d = f32_to_f16(d);
        y[i].m = f32_to_f16(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            int lo = int((x[j] - mn) * id + 0.5f), hi = int((x[j + QK4_1 / 2] - mn) * id + 0.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            y[i].qs[j] = uint8_t(lo | hi << 4);
        }
    }
}

void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        float d = signed_absmax(x, QK5_0) / -16.0f;
        float id = inverse_or_zero(d);
        y[i].d = f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int lo = int(x[j] * id + 16.5f), hi = int(x[j + QK5_0 / 2] * id + 16.5f);
            lo = lo > 31 ? 31 : lo;
            hi = hi > 31 ? 31 : hi;
            y[i].qs[j] = uint8_t((lo & 0xf) | (hi & 0xf) << 4);
            qh |= uint32_t(lo >> 4) << j | uint32_t(hi >> 4) << (j + QK5_0 / 2);
        }
        store_u32(y[i].qh, qh);
    }
}

void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < QK5_1; j++) { mn = std::fmin(mn, x[j]); mx = std::fmax(mx, x[j]); }
        float d = (mx - mn) / 31.0f;
        float id = inverse_or_zero(d);
        y[i].d = f32_to_f16(d);
        y[i].m = f32_to_f16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            int lo = int((x[j] - mn) * id + 0.5f), hi = int((x[j + QK5_1 / 2] - mn) * id + 0.5f);
            lo = lo > 31 ? 31 : lo;
            hi = hi > 31 ? 31 : hi;
            y[i].qs[j] = uint8_t((lo & 0xf) | (hi & 0xf) << 4);
            qh |= uint32_t(lo >> 4) << j | uint32_t(hi >> 4) << (j + QK5_1 / 2);
        }
        store_u32(y[i].qh, qh);
    }
}

// Q8_0 and the int8 part of Q8_1 / Q8_K: d = max|x| / 127, q = round(x / d).
static inline float quantize_int8(const float* x, int8_t* q, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = std::fmax(amax, std::fabs(x[j]));
    float d = amax / 127.0f;
    float id = inverse_or_zero(d);
    for (int j = 0; j < n; j++) q[j] = int8_t(std::roundf(x[j] * id));
    return d;
}

void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) y[i].d = f32_to_f16(quantize_int8(x, y[i].qs, QK8_0));
}

// s carries d * sum(q) so that Q4_1/Q5_1 dots can add the weight's min term
// without touching the values again.  Stored in f16 as ggml does.
void quantize_q8_1(const float* x, block_q8_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        float d = quantize_int8(x, y[i].qs, QK8_1);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) sum += y[i].qs[j];
        y[i].d = f32_to_f16(d);
        y[i].s = f32_to_f16(d * float(sum));
    }
}

// One f32 scale per 256 values, and the sum of each run of 16 quants for the
// K-quants' min / offset terms.  Symmetric (-127..127) so that the SIMD sign
// trick (|w| * sign(a, w)) never sees -128.
void quantize_q8_K(const float* x, block_q8_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        y[i].d = quantize_int8(x, y[i].qs, QK_K);
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
            y[i].bsums[j] = int16_t(s);
        }
    }
}

}  // namespace

void quantize_row_ref(uint32_t type, const float* x, void* y, int64_t n) {
    const TypeTraits& t = type_traits(type);
    if (!t.known || n % t.block_size != 0)
        throw MinferError(strfmt("quantize: %lld values is not a multiple of the %s block size %d",
                                 (long long)n, t.name, t.block_size));
    int64_t nb = n / t.block_size;
    switch (type) {
        case GGML_TYPE_F32: std::memcpy(y, x, size_t(n) * 4); return;
        case GGML_TYPE_F16: for (int64_t i = 0; i < n; i++) ((uint16_t*)y)[i] = f32_to_f16(x[i]); return;
        case GGML_TYPE_Q4_0: return quantize_q4_0(x, (block_q4_0*)y, nb);
        case GGML_TYPE_Q4_1: return quantize_q4_1(x, (block_q4_1*)y, nb);
        case GGML_TYPE_Q5_0: return quantize_q5_0(x, (block_q5_0*)y, nb);
        case GGML_TYPE_Q5_1: return quantize_q5_1(x, (block_q5_1*)y, nb);
        case GGML_TYPE_Q8_0: return quantize_q8_0(x, (block_q8_0*)y, nb);
        default:
            throw MinferError(strfmt("quantize: no reference quantizer for type %s", t.name));
    }
}

void quantize_row_act(uint32_t type, const float* x, void* y, int64_t n) {
    const TypeTraits& t = type_traits(type);
    if (!t.known || n % t.block_size != 0)
        throw MinferError(strfmt("quantize_act: %lld values is not a multiple of the %s block size %d",
                                 (long long)n, t.name, t.block_size));
    int64_t nb = n / t.block_size;
    switch (type) {
        case GGML_TYPE_F32: std::memcpy(y, x, size_t(n) * 4); return;
        case GGML_TYPE_Q8_0: return quantize_q8_0(x, (block_q8_0*)y, nb);
        case GGML_TYPE_Q8_1: return quantize_q8_1(x, (block_q8_1*)y, nb);
        case GGML_TYPE_Q8_K: return quantize_q8_K(x, (block_q8_K*)y, nb);
        default:
            throw MinferError(strfmt("quantize_act: %s is not an activation type", t.name));
    }
}

int64_t act_scale_count(uint32_t act_type, int64_t n) {
    switch (act_type) {
        case GGML_TYPE_Q8_0: return 3 * (n / QK8_0);
        case GGML_TYPE_Q8_1: return 2 * (n / QK8_1);
        default: return 0;
    }
}

void act_scales(uint32_t act_type, const void* a, int64_t n, float* out) {
    if (act_type == GGML_TYPE_Q8_0) {
        const block_q8_0* b = (const block_q8_0*)a;
        for (int64_t i = 0; i < n / QK8_0; i++) {
            int32_t eo[2] = {0, 0};  // values 0-3 mod 8 and 4-7 mod 8, as the even/odd kernels split a block
            for (int j = 0; j < QK8_0; j++) eo[(j / 4) % 2] += b[i].qs[j];
            out[3 * i] = f16_to_f32(b[i].d);
            std::memcpy(&out[3 * i + 1], eo, sizeof eo);
        }
    } else if (act_type == GGML_TYPE_Q8_1) {
        const block_q8_1* b = (const block_q8_1*)a;
        for (int64_t i = 0; i < n / QK8_1; i++) out[2 * i] = f16_to_f32(b[i].d), out[2 * i + 1] = f16_to_f32(b[i].s);
    }
}

}  // namespace minfer
