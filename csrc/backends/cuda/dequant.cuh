// What each GGUF block means, on the device: dequant8<TYPE>(row, j, y) writes
// the 8 weights j..j+7 (j a multiple of 8) of one row.  The same definitions
// as csrc/quant/dequantize.cpp (the reference), read 8 values at a time so a
// thread's loads of one block's bytes are contiguous.  The explicit-rounding
// intrinsics keep nvcc from contracting d * q - m into an FMA, so the values
// are bit-identical to the reference's.  Every kernel that reads
// weights (matvec, GEMM tiles, embedding gather) goes through here.  Reference: csrc/quant/dequantize.cpp;
// tests/test_cuda_matvec.py.
#pragma once
#include "backends/cuda/common.cuh"
#include "backends/cuda/q6k_layout.cuh"
#include "quant/types.h"

namespace minfer::cuda {

// Sizes of a block in bytes and values, per type (ggml's layouts; Q6_K's blocks are re-laid on the device, and
// its rows padded to 16 bytes: q6k_layout.cuh).
template <int T> struct Block;
template <> struct Block<GGML_TYPE_F32>  { static constexpr int bytes = 4,   values = 1; };
template <> struct Block<GGML_TYPE_F16>  { static constexpr int bytes = 2,   values = 1; };
template <> struct Block<GGML_TYPE_BF16> { static constexpr int bytes = 2,   values = 1; };
template <> struct Block<GGML_TYPE_IQ4_NL> { static constexpr int bytes = 18, values = 32; };
template <> struct Block<GGML_TYPE_IQ4_XS> { static constexpr int bytes = 136, values = 256; };
template <> struct Block<GGML_TYPE_Q4_0> { static constexpr int bytes = 18,  values = 32; };
template <> struct Block<GGML_TYPE_Q4_1> { static constexpr int bytes = 20,  values = 32; };
template <> struct Block<GGML_TYPE_Q5_0> { static constexpr int bytes = 22,  values = 32; };
template <> struct Block<GGML_TYPE_Q5_1> { static constexpr int bytes = 24,  values = 32; };
template <> struct Block<GGML_TYPE_Q8_0> { static constexpr int bytes = 34,  values = 32; };
template <> struct Block<GGML_TYPE_Q4_K> { static constexpr int bytes = 144, values = 256; };
template <> struct Block<GGML_TYPE_Q5_K> { static constexpr int bytes = 176, values = 256; };
template <> struct Block<GGML_TYPE_Q6_K> { static constexpr int bytes = 210, values = 256; };

__device__ __forceinline__ void k_scale_min_dev(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Level q (0..15) of IQ4_NL / IQ4_XS: byte q of kvalues_iq4nl (quant/types.h) packed in four words, picked by
// one byte permute (no table in memory, no divergent loads).
__device__ __forceinline__ int iq4_level(int q) {
    const uint32_t lo = q & 8 ? 0x26190d01U : 0xbfad9881U, hi = q & 8 ? 0x71594535U : 0xf6eaddcfU;
    return int(int8_t(__byte_perm(lo, hi, unsigned(q & 7)) & 0xff));
}

// The 6-bit scale of sub-block j (0..7) of an IQ4_XS super-block b: low 4 bits in scales_l, high 2 in scales_h.
__device__ __forceinline__ int iq4xs_scale(const uint8_t* b, int j) {
    return ((b[4 + j / 2] >> (4 * (j % 2))) & 0xf) | (((b[2 + j / 4] >> (2 * (j % 4))) & 3) << 4);
}

// 8 bf16 values at p (16-byte aligned) as floats: the top halves of f32 bit patterns.
__device__ __forceinline__ void bf16x8(const uint8_t* p, float* y) {
    const uint4 v = *(const uint4*)p;
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        y[2 * i] = __uint_as_float(w[i] << 16);
        y[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

template <int T>
__device__ __forceinline__ void dequant8(const uint8_t* row, int64_t j, float* y) {
    constexpr int QB = Block<T>::bytes, QV = Block<T>::values;
    if constexpr (T == GGML_TYPE_F32) {
        const float4* p = (const float4*)(row + j * 4);
        float4 a = p[0], b = p[1];
        y[0] = a.x; y[1] = a.y; y[2] = a.z; y[3] = a.w; y[4] = b.x; y[5] = b.y; y[6] = b.z; y[7] = b.w;
    } else if constexpr (T == GGML_TYPE_F16) {
        uint4 v = *(const uint4*)(row + j * 2);
        const __half2* h = (const __half2*)&v;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(h[i]);
            y[2 * i] = f.x;
            y[2 * i + 1] = f.y;
        }
    } else if constexpr (T == GGML_TYPE_BF16) {
        bf16x8(row + j * 2, y);
    } else {
        const uint8_t* b = row + (j / QV) * QB;
        const int e = int(j % QV);  // first value inside the block
        if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
            const uint8_t* qs = b + (T == GGML_TYPE_Q4_0 ? 2 : 4);
            const float d = f16_at(b);
            const int shift = e >= 16 ? 4 : 0, l0 = e & 15;
            if constexpr (T == GGML_TYPE_Q4_0) {
#pragma unroll
                for (int i = 0; i < 8; i++) y[i] = __fmul_rn(d, float(int((qs[l0 + i] >> shift) & 0xf) - 8));
            } else {
                const float m = f16_at(b + 2);
#pragma unroll
                for (int i = 0; i < 8; i++) y[i] = __fadd_rn(__fmul_rn(d, float((qs[l0 + i] >> shift) & 0xf)), m);
            }
        } else if constexpr (T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1) {
            constexpr int off = T == GGML_TYPE_Q5_0 ? 2 : 4;
            const float d = f16_at(b);
            const uint32_t qh = u32_at2(b + off);
            const uint8_t* qs = b + off + 4;
            const int shift = e >= 16 ? 4 : 0, l0 = e & 15;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int q = ((qs[l0 + i] >> shift) & 0xf) | int((qh >> (e + i)) & 1) << 4;
                if constexpr (T == GGML_TYPE_Q5_0) y[i] = __fmul_rn(d, float(q - 16));
                else y[i] = __fadd_rn(__fmul_rn(d, float(q)), f16_at(b + 2));
            }
        } else if constexpr (T == GGML_TYPE_IQ4_NL || T == GGML_TYPE_IQ4_XS) {
            // IQ4_XS: sub-block e / 32 of the super-block, scale d * (ls - 32), nibbles at 8 + 16 * sub
            const int sub = e / 32, l0 = e % 32;
            float dl = f16_at(b);
            const uint8_t* qs = b + 2;
            if constexpr (T == GGML_TYPE_IQ4_XS) {
                dl = __fmul_rn(dl, float(iq4xs_scale(b, sub) - 32));
                qs = b + 8 + 16 * sub;
            }
            const int shift = l0 >= 16 ? 4 : 0;
#pragma unroll
            for (int i = 0; i < 8; i++) y[i] = __fmul_rn(dl, float(iq4_level((qs[(l0 & 15) + i] >> shift) & 0xf)));
        } else if constexpr (T == GGML_TYPE_Q8_0) {
            const float d = f16_at(b);
            const int8_t* qs = (const int8_t*)(b + 2 + e);
#pragma unroll
            for (int i = 0; i < 8; i++) y[i] = __fmul_rn(float(qs[i]), d);
        } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
            const float d = f16_at(b), dmin = f16_at(b + 2);
            const int sub = e / 32, l0 = e % 32;
            int sc, m;
            k_scale_min_dev(b + 4, sub, &sc, &m);
            const float dl = __fmul_rn(d, float(sc)), ml = __fmul_rn(dmin, float(m));
            const uint8_t* qs = b + (T == GGML_TYPE_Q4_K ? 16 : 48) + 32 * (sub / 2);
            const int shift = 4 * (sub % 2);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int v = (qs[l0 + i] >> shift) & 0xf;
                if constexpr (T == GGML_TYPE_Q5_K) v |= ((b[16 + l0 + i] >> sub) & 1) << 4;
                y[i] = __fsub_rn(__fmul_rn(dl, float(v)), ml);
            }
        } else if constexpr (T == GGML_TYPE_Q6_K) {  // the device layout (q6k_layout.cuh): block j / QV re-laid
            // values e..e + 7 of sub-block sub = 2g + hi (chunk g): nibble hi of ql' bytes 32g + m0.., the high
            // bits at 2 (m0 / 16) + 4 hi of qh' bytes 16g + m0 % 16..; the scale (e / 16) % 4 of the chunk's four
            const int sub = e / 32, g = sub / 2, hi = sub % 2, m0 = e % 32, pre = q6k_pre(j / QV);
            const float d = f16_at(b + q6k_d(pre));
            const uint8_t* ql = b + pre + 32 * g + m0;
            const uint8_t* qh = b + pre + 128 + 16 * g + m0 % 16;
            const int hs = 2 * (m0 / 16) + 4 * hi;
            const float dl = __fmul_rn(d, float(int8_t(b[q6k_sc(g, pre) + (e / 16) % 4])));
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int lo = (ql[i] >> (4 * hi)) & 0xf, h2 = (qh[i] >> hs) & 3;
                y[i] = __fmul_rn(dl, float((lo | h2 << 4) - 32));
            }
        }
    }
}

}  // namespace minfer::cuda

// Calls F.template operator()<TYPE>() for a runtime weight type (the kernels
// are instantiated once per supported type); returns false for other types.
#define MINFER_CUDA_TYPES(X) X(GGML_TYPE_F32) X(GGML_TYPE_F16) X(GGML_TYPE_BF16) X(GGML_TYPE_Q4_0) X(GGML_TYPE_Q4_1) \
    X(GGML_TYPE_Q5_0) X(GGML_TYPE_Q5_1) X(GGML_TYPE_Q8_0) X(GGML_TYPE_Q4_K) X(GGML_TYPE_Q5_K) X(GGML_TYPE_Q6_K)      \
    X(GGML_TYPE_IQ4_NL) X(GGML_TYPE_IQ4_XS)
