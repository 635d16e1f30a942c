// How the bf16 batch product (gemm_mma.cu) turns 32 quantized values of one weight row -- a unit -- into mma.sync
// fragments with their scales applied, so that the tensor cores' f32 accumulators carry a whole row (no per-unit
// scaling of the sums), and the mma itself.
//
// The mma's k order within a unit is permuted so that a lane's fragments are contiguous bytes: lane t (of a
// row's four) takes values 8t..8t+7 of each unit, the first mma (8t, 8t+2 | 8t+1, 8t+3), the second
// (8t+4, 8t+6 | 8t+5, 8t+7); mma_act stores x in that order (each 8 values as 0 2 1 3 4 6 5 7), so one 16-byte
// load gives a lane both mmas' activation fragments.  The decoders take the unit's bytes as words, wherever the
// caller loaded them from.  Reference: float64 numpy over the dequantized weights (tests/test_cuda_matvec.py).
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/matvec_q8_chunks.cuh"

namespace minfer::cuda {

// c += a (16 x 16, rows) b (16 x 8, columns) in bf16, f32 sums.  Fragments (g = lane / 4, t = lane % 4): a0 row g,
// k 2t, 2t + 1; a1 row g + 8; a2, a3 the same at k + 8; b0 k 2t, 2t + 1 of column g, b1 k + 8; c0, c1 row g,
// columns 2t, 2t + 1, c2, c3 row g + 8.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 v) { return *(uint32_t*)&v; }
__device__ __forceinline__ __nv_bfloat162 as_bf2(uint32_t v) { return *(__nv_bfloat162*)&v; }
__device__ __forceinline__ __nv_bfloat162 bf2(float v) { return __float2bfloat162_rn(v); }

// Bytes 0 and 2 (lo) and 1 and 3 (hi) of w, each below 128, as bf16 pairs 128 + byte: the bf16 of 128 has its
// lowest mantissa bit worth 1, so or-ing a 7-bit integer into it adds that integer exactly.
__device__ __forceinline__ void bf16_pairs_128(uint32_t w, uint32_t mask, uint32_t& lo, uint32_t& hi) {
    lo = (w & mask) | 0x43004300u;
    hi = ((w >> 8) & mask) | 0x43004300u;
}

// A unit's fragments of one weight row: f[0], f[1] the first mma's (k 2t.. | 2t + 8..), f[2], f[3] the second's.
struct Frag { uint32_t f[4]; };

// (q - off) * s + m over the four pairs of 128 + q.
__device__ __forceinline__ Frag scaled(const uint32_t (&p)[4], __nv_bfloat162 off, __nv_bfloat162 s, __nv_bfloat162 m) {
    Frag r;
#pragma unroll
    for (int i = 0; i < 4; i++) r.f[i] = as_u32(__hfma2(__hsub2(as_bf2(p[i]), off), s, m));
    return r;
}

// Q4_K: a block's header (d and dmin, then the 12 bytes of 6-bit scales and mins) as its four words.
struct Q4kHdr { float d, dmin; uint32_t s0, s1, s2; };
__device__ __forceinline__ Q4kHdr q4k_hdr(uint32_t dm, uint32_t s0, uint32_t s1, uint32_t s2) {
    return Q4kHdr{h2f(dm), h2f(dm >> 16), s0, s1, s2};
}
// Unit j of a Q4_K block from q, lane t's 8 bytes of its 32-byte group j / 2 (values 8t..8t+7, nibble j % 2).
__device__ __forceinline__ Frag q4k_unit(uint2 q, const Q4kHdr& h, int j) {
    uint32_t scw, mnw;
    k_scale_min_words(h.s0, h.s1, h.s2, j < 4, scw, mnw);
    const int sh = 8 * (j % 4), n = 4 * (j % 2);
    uint32_t v[4];
    bf16_pairs_128(q.x >> n, 0x000f000fu, v[0], v[1]);
    bf16_pairs_128(q.y >> n, 0x000f000fu, v[2], v[3]);
    return scaled(v, bf2(128.0f), bf2(h.d * float((scw >> sh) & 0xff)), bf2(-h.dmin * float((mnw >> sh) & 0xff)));
}

// Unit j of a Q6_K block in the device layout (q6k_layout.cuh), sub-block j % 2 of chunk g = j / 2: ql' byte l's
// nibble j % 2 holds its value l; qh' byte l the top bits of the chunk's values l, l + 16, 32 + l, 48 + l; one
// int8 scale a 16 values.  ql: lane t's 8 bytes of the chunk's ql' (32 g + 8 t), qh: its 8 of qh' (16 g +
// 8 (t & 1)), scw: the chunk's scale word, d the block's scale.
__device__ __forceinline__ Frag q6k_unit(uint2 ql, uint2 qh, uint32_t scw, float d, int j, int t) {
    const int n = 4 * (j % 2), hs = 2 * (t >> 1) + n;
    const uint32_t w0 = ((ql.x >> n) & 0x0f0f0f0fu) | (((qh.x >> hs) & 0x03030303u) << 4);
    const uint32_t w1 = ((ql.y >> n) & 0x0f0f0f0fu) | (((qh.y >> hs) & 0x03030303u) << 4);
    const int sc = int(int8_t((scw >> (8 * (2 * (j % 2) + (t >> 1)))) & 0xff));
    uint32_t v[4];
    bf16_pairs_128(w0, 0x003f003fu, v[0], v[1]);
    bf16_pairs_128(w1, 0x003f003fu, v[2], v[3]);
    return scaled(v, bf2(160.0f), bf2(d * float(sc)), bf2(0.0f));
}

}  // namespace minfer::cuda
