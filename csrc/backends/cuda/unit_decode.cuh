// Decode's view of a weight row: 32-value units (one block of a 32-value type,
// or one 32-value sub-block of a K-quant) read with the widest loads their
// alignment allows, as integer quants plus the unit's affine factors:
//
//   w_i = (i < 16 ? a_lo : a_hi) * q_i - b        for i in 0..31
//
// so a dot product with x is a_lo * sum_lo(q x) + a_hi * sum_hi(q x) - b * sum(x):
// the scales are applied once per unit instead of once per weight.  The
// element-by-element definition is dequant8 (dequant.cuh) and the reference
// (csrc/quant/dequantize.cpp); tests/test_cuda_matvec.py checks matvec against both.
#pragma once
#include "backends/cuda/dequant.cuh"

namespace minfer::cuda {

struct Unit {
    float q[32];
    float a_lo, a_hi, b;
};

__device__ __forceinline__ float h2f(uint32_t bits16) { return __half2float(__ushort_as_half(uint16_t(bits16))); }

// 16 consecutive bytes at a 2-byte aligned address, as 4 little-endian words.
__device__ __forceinline__ void load16_a2(const uint8_t* p, uint32_t* w) {
    const uint16_t* h = (const uint16_t*)p;
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = uint32_t(h[2 * i]) | uint32_t(h[2 * i + 1]) << 16;
}
__device__ __forceinline__ void load16_a16(const uint8_t* p, uint32_t* w) {
    const uint4 v = *(const uint4*)p;
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
__device__ __forceinline__ void load16_a4(const uint8_t* p, uint32_t* w) {
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = ((const uint32_t*)p)[i];
}
__device__ __forceinline__ int byte_at(const uint32_t* w, int i) { return int((w[i / 4] >> (8 * (i % 4))) & 0xff); }

// Q4_K/Q5_K: the four 6-bit scales (scw) and mins (mnw) of one half of a super-block (sub-blocks 0-3 if
// lower, 4-7 if not), one per byte, from the scale words s0 s1 s2 -- whole words and no branch: the lanes
// of a warp hold sub-blocks of both halves, and a branch ran the two unpackings one after the other
// serially.  Sub-block j's are bytes j % 4.
__device__ __forceinline__ void k_scale_min_words(uint32_t s0, uint32_t s1, uint32_t s2, bool lower, uint32_t& scw,
                                                  uint32_t& mnw) {
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, top2 = 0x03030303u;
    scw = lower ? s0 & lo6 : (s2 & lo4) | (((s0 >> 6) & top2) << 4);
    mnw = lower ? s1 & lo6 : ((s2 >> 4) & lo4) | (((s1 >> 6) & top2) << 4);
}

template <int T>
__device__ __forceinline__ void decode_unit(const uint8_t* __restrict__ row, int64_t u, Unit& U) {
    U.b = 0.0f;
    if constexpr (T == GGML_TYPE_F32) {
        const float4* p = (const float4*)(row + u * 128);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 v = p[i];
            U.q[4 * i] = v.x, U.q[4 * i + 1] = v.y, U.q[4 * i + 2] = v.z, U.q[4 * i + 3] = v.w;
        }
        U.a_lo = U.a_hi = 1.0f;
    } else if constexpr (T == GGML_TYPE_F16) {
        const uint4* p = (const uint4*)(row + u * 64);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 v = p[i];
            const __half2* h = (const __half2*)&v;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 f = __half22float2(h[k]);
                U.q[8 * i + 2 * k] = f.x, U.q[8 * i + 2 * k + 1] = f.y;
            }
        }
        U.a_lo = U.a_hi = 1.0f;
    } else if constexpr (T == GGML_TYPE_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) bf16x8(row + u * 64 + 16 * i, U.q + 8 * i);
        U.a_lo = U.a_hi = 1.0f;
    } else if constexpr (T == GGML_TYPE_IQ4_NL || T == GGML_TYPE_IQ4_XS) {
        // the unit is one IQ4_NL block, or sub-block u % 8 of an IQ4_XS super-block (scale d * (ls - 32))
        uint32_t qs[4];
        if constexpr (T == GGML_TYPE_IQ4_NL) {
            const uint8_t* b = row + u * 18;
            U.a_lo = U.a_hi = h2f(*(const uint16_t*)b);
            load16_a2(b + 2, qs);
        } else {
            const uint8_t* b = row + (u / 8) * 136;
            const int j = int(u % 8);
            U.a_lo = U.a_hi = h2f(*(const uint16_t*)b) * float(iq4xs_scale(b, j) - 32);
            load16_a4(b + 8 + 16 * j, qs);  // 136-byte super-blocks: qs is 8-byte aligned, not 16
        }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int v = byte_at(qs, i);
            U.q[i] = float(iq4_level(v & 0xf));
            U.q[i + 16] = float(iq4_level(v >> 4));
        }
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
        const uint8_t* b = row + u * Block<T>::bytes;
        uint32_t qs[4];
        if constexpr (T == GGML_TYPE_Q4_0) {
            load16_a2(b + 2, qs);
            U.a_lo = U.a_hi = h2f(*(const uint16_t*)b);
            U.b = 8.0f * U.a_lo;
        } else {
            load16_a4(b + 4, qs);
            const uint32_t dm = *(const uint32_t*)b;
            U.a_lo = U.a_hi = h2f(dm);
            U.b = -h2f(dm >> 16);
        }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int v = byte_at(qs, i);
            U.q[i] = float(v & 0xf);
            U.q[i + 16] = float(v >> 4);
        }
    } else if constexpr (T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1) {
        const uint8_t* b = row + u * Block<T>::bytes;
        uint32_t qs[4], qh;
        if constexpr (T == GGML_TYPE_Q5_0) {
            U.a_lo = U.a_hi = h2f(*(const uint16_t*)b);
            U.b = 16.0f * U.a_lo;
            qh = u32_at2(b + 2);
            load16_a2(b + 6, qs);
        } else {
            const uint32_t dm = *(const uint32_t*)b;
            U.a_lo = U.a_hi = h2f(dm);
            U.b = -h2f(dm >> 16);
            qh = *(const uint32_t*)(b + 4);
            load16_a4(b + 8, qs);
        }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int v = byte_at(qs, i);
            U.q[i] = float((v & 0xf) | int((qh >> i) & 1) << 4);
            U.q[i + 16] = float((v >> 4) | int((qh >> (i + 16)) & 1) << 4);
        }
    } else if constexpr (T == GGML_TYPE_Q8_0) {
        const uint8_t* b = row + u * 34;
        U.a_lo = U.a_hi = h2f(*(const uint16_t*)b);
        uint32_t qs[8];
        load16_a2(b + 2, qs);
        load16_a2(b + 18, qs + 4);
#pragma unroll
        for (int i = 0; i < 32; i++) U.q[i] = float(int8_t(byte_at(qs, i)));
    } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        const uint8_t* b = row + (u / 8) * Block<T>::bytes;
        const int j = int(u % 8);
        const uint32_t dm = *(const uint32_t*)b;
        const uint32_t s0 = ((const uint32_t*)b)[1], s1 = ((const uint32_t*)b)[2], s2 = ((const uint32_t*)b)[3];
        uint32_t scw, mnw;
        k_scale_min_words(s0, s1, s2, j < 4, scw, mnw);
        const int sh = 8 * (j % 4);
        const int sc = int((scw >> sh) & 0xff), m = int((mnw >> sh) & 0xff);
        U.a_lo = U.a_hi = h2f(dm) * float(sc);
        U.b = h2f(dm >> 16) * float(m);
        uint32_t qs[8];
        const uint8_t* qp = b + (T == GGML_TYPE_Q4_K ? 16 : 48) + 32 * (j / 2);
        load16_a16(qp, qs);
        load16_a16(qp + 16, qs + 4);
        const int shift = 4 * (j % 2);
        if constexpr (T == GGML_TYPE_Q5_K) {
            uint32_t qh[8];
            load16_a16(b + 16, qh);
            load16_a16(b + 32, qh + 4);
#pragma unroll
            for (int i = 0; i < 32; i++)
                U.q[i] = float(((byte_at(qs, i) >> shift) & 0xf) | ((byte_at(qh, i) >> j) & 1) << 4);
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) U.q[i] = float((byte_at(qs, i) >> shift) & 0xf);
        }
    } else if constexpr (T == GGML_TYPE_Q6_K) {
        const uint8_t* b = row + (u / 8) * 210;  // the device layout (q6k_layout.cuh): re-laid, rotated by pre
        const int j = int(u % 8), g = j / 2, hi = j % 2, pre = q6k_pre(u / 8);  // sub-block j = 2g + hi: nibble hi
        uint32_t ql[8], qh[4];
        load16_a2(b + pre + 32 * g, ql);
        load16_a2(b + pre + 32 * g + 16, ql + 4);
        load16_a2(b + pre + 128 + 16 * g, qh);
        const float d = h2f(*(const uint16_t*)(b + q6k_d(pre)));
        const uint32_t sc = *(const uint16_t*)(b + q6k_sc(g, pre) + 2 * hi);  // the two int8 scales of this unit
        U.a_lo = d * float(int8_t(sc & 0xff));
        U.a_hi = d * float(int8_t(sc >> 8));
        U.b = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int lo = (byte_at(ql, i) >> (4 * hi)) & 0xf;
            const int h2 = (byte_at(qh, i % 16) >> (2 * (i / 16) + 4 * hi)) & 3;
            U.q[i] = float((lo | h2 << 4) - 32);
        }
    }
}

// Types whose units have no offset term (b == 0 always): the sum of x is not needed.
template <int T> constexpr bool unit_has_offset() {
    return !(T == GGML_TYPE_F32 || T == GGML_TYPE_F16 || T == GGML_TYPE_BF16 || T == GGML_TYPE_Q8_0 ||
             T == GGML_TYPE_Q6_K || T == GGML_TYPE_IQ4_NL || T == GGML_TYPE_IQ4_XS);
}

}  // namespace minfer::cuda
