// A chunk of a quantized weight row on decode's 8-bit activations (matvec_q8.cu's kernels): what its bytes are,
// how they are loaded, and how they are dotted with x -- the arithmetic every 8-bit-activation matvec shares, so
// that kernels that walk the same chunks in the same order give the same bits.  A chunk is one 32-value block, or
// for Q4_K and Q6_K 64 values (two 32-value sub-blocks that share their bytes of quants).  Reference:
// csrc/quant/dequantize.cpp; tests/test_cuda_matvec.py.
#pragma once
#include "backends/cuda/common.cuh"
#include "backends/cuda/q6k_layout.cuh"
#include "backends/cuda/unit_decode.cuh"
#include "quant/types.h"

namespace minfer::cuda {

// x rows quantized: q [rows][K] int8 (16-byte aligned), ds [rows][K / 32] (d, d * sum(q)).
struct XQ {
    const int8_t* q;
    const float2* ds;
    int64_t K;
};

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// Unsigned bytes of a times signed bytes of b, plus c (PTX dp4a.u32.s32; the intrinsic has only the forms with
// both sides of one signedness).
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// A Q4_K chunk's weight bytes (sub-blocks 2g and 2g + 1 of super-block c / 4, g = c % 4): the super-block's
// header (d, dmin, the 12 bytes of 6-bit scales and mins) and the 32 bytes of nibbles the two share.
struct Q4kChunk {
    uint4 hdr, q0, q1;
};

__device__ __forceinline__ Q4kChunk q4k_load(const uint8_t* __restrict__ row, int c) {
    const uint8_t* b = row + int64_t(c / 4) * 144;
    const uint4* q = (const uint4*)(b + 16 + 32 * (c % 4));
    return Q4kChunk{*(const uint4*)b, q[0], q[1]};
}

// The chunk dotted with x (xq: the row's int8 values, ds: its block scales): w = d sc q - dmin m.  The high
// nibbles are dotted in place (w & 0xf0 = 16 q, as unsigned bytes): their sum is 16 times the nibbles' sum,
// exact in an int (|16 sum| <= 240 * 127 * 32) and in a float (< 2^24), and scaling by 1/16 is exact, so the
// result has the bits of shifting each word down first -- without the 8 shifts a chunk.
__device__ __forceinline__ float q4k_dot(const Q4kChunk& w, int c, const int8_t* __restrict__ xq,
                                         const float2* __restrict__ ds) {
    const int g = c % 4, j = 2 * g;
    const uint32_t q[8] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w, w.q1.x, w.q1.y, w.q1.z, w.q1.w};
    const int4* xp = (const int4*)(xq + c * 64);
    const int4 xa = xp[0], xb = xp[1], xc = xp[2], xe = xp[3];
    const int x_lo[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    const int x_hi[8] = {xc.x, xc.y, xc.z, xc.w, xe.x, xe.y, xe.z, xe.w};
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        s0 = dp4a(int(q[i] & 0x0f0f0f0fu), x_lo[i], s0);
        s1 = dp4a_us(q[i] & 0xf0f0f0f0u, x_hi[i], s1);
    }
    // the 6-bit scales and mins of sub-blocks j and j + 1 (j even), without a branch (a branch
    // serialized the lanes of the two halves)
    uint32_t scw, mnw;
    k_scale_min_words(w.hdr.y, w.hdr.z, w.hdr.w, j < 4, scw, mnw);
    const int sh = 8 * (j % 4);
    const int sc0 = int((scw >> sh) & 0xff), sc1 = int((scw >> (sh + 8)) & 0xff);
    const int m0 = int((mnw >> sh) & 0xff), m1 = int((mnw >> (sh + 8)) & 0xff);
    const float4 xd = *(const float4*)(ds + c * 2);  // (d, d sum) of both sub-blocks
    const uint32_t dm = w.hdr.x;
    return h2f(dm) * (float(sc0) * xd.x * float(s0) + float(sc1) * xd.z * (float(s1) * 0.0625f)) -
           h2f(dm >> 16) * (float(m0) * xd.y + float(m1) * xd.w);
}

// N words (4N bytes) at a 2-byte aligned address (the packed 18/22/34/210-byte blocks) from N + 1
// aligned 32-bit loads and funnel shifts, instead of 2N 16-bit loads.  Reads up to 4 bytes past the
// field: into the next block, or past a tensor's last block into the weight arena's slack.
template <int N>
__device__ __forceinline__ void load_a2(const uint8_t* p, uint32_t* w) {
    const uint32_t* q = (const uint32_t*)(uintptr_t(p) & ~uintptr_t(3));
    const uint32_t sh = uint32_t(uintptr_t(p) & 3) * 8;
    uint32_t v[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++) v[i] = q[i];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

// q - 32 in each byte of four 6-bit values (0..63; Q6_K), as signed bytes: setting each byte's top bit first
// keeps every byte's subtraction from borrowing out of it, and the xor puts the sign back.  The same bytes
// as __vsubss4(q, 0x20202020) (nothing saturates), in 3 integer ops instead of its ~14-instruction emulation
// (sm_90 has no byte-SIMD subtract).
__device__ __forceinline__ uint32_t minus32_bytes(uint32_t q) { return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u; }

// Or q left as it is: sum(q x) + sum(-32 x), the second a dp4a of x with -32 in every byte -- the same integer
// (no sum overflows), so the same bits, in 1 instruction per 4 values instead of 3.  Taken where a lane's loop
// is unrolled by two (long Q6_K rows measured faster); the builds at the 40-register cap keep the byte-wise
// subtract (there the extra register spills).
constexpr int kMinus32 = int(0xe0e0e0e0u);

// Four bits of qh (values 4w..4w+3) moved to bit 4 of each byte (Q5_0's fifth bit).
__device__ __forceinline__ int spread4(uint32_t b4) {
    return int(((b4 & 1) << 4) | ((b4 & 2) << 11) | ((b4 & 4) << 18) | ((b4 & 8) << 25));
}

template <int T> constexpr int chunk_values() { return T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q6_K ? 64 : 32; }

// How a Q6_K chunk is read and offset: its qh' first, then its ql 16 bytes at a time (kQ6Words: fewer registers
// live), or all 48 bytes first (kQ6Wide), the 32 subtracted byte-wise (minus32_bytes); kQ6WideDp4a: all first, and the
// 32 taken off by dp4a (kMinus32).
enum : int { kQ6Words = 0, kQ6Wide = 1, kQ6WideDp4a = 2 };

// Where Q6_K chunk c of a row lies (the device layout, q6k_layout.cuh): sub-blocks 2g and 2g + 1 of super-block
// c / 4 (g = c % 4) share 32 bytes of ql' (low and high nibbles); their high bits are the chunk's own 16 bytes of
// qh', their four scales one 32-bit word (sc), d the block's; ql' and qh' 16-byte aligned.
struct Q6kAt {
    const uint8_t* b;
    const uint4 *ql, *qh;
    int sub, sc, d;
};

__device__ __forceinline__ Q6kAt q6k_at(const uint8_t* __restrict__ row, int c) {
    const int64_t blk = c / 4;
    const uint8_t* b = row + blk * 210;
    const int pre = q6k_pre(blk), g = c % 4;
    return Q6kAt{b, (const uint4*)(b + pre + 32 * g), (const uint4*)(b + pre + 128 + 16 * g), int(blk) * 8 + 2 * g,
                 q6k_sc(g, pre), q6k_d(pre)};
}

// Half h of a Q6_K chunk (16 bytes of its ql', L, and its 16 bytes of qh', H) dotted with the x of sub-blocks
// 2g (xs) and 2g + 1 (xs + 32) into s[h] and s[2 + h].  DP4A_32: the 32 taken off by a dp4a of x (kMinus32),
// else byte-wise (minus32_bytes): the same integers.
template <bool DP4A_32>
__device__ __forceinline__ void q6k_half(uint4 L, uint4 H, const int8_t* __restrict__ xs, int h, int (&s)[4]) {
    const uint32_t ql[4] = {L.x, L.y, L.z, L.w}, qh[4] = {H.x, H.y, H.z, H.w};
    const int4 xa = ((const int4*)xs)[h], xb = ((const int4*)xs)[2 + h];  // sub-blocks 2g and 2g + 1
    const int xl[4] = {xa.x, xa.y, xa.z, xa.w}, xh[4] = {xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t qs = qh[i] >> (2 * h);  // bits 0-1 of each byte: lo's top two, bits 4-5: hi's
        const uint32_t lo = (ql[i] & 0x0f0f0f0fu) | ((qs << 4) & 0x30303030u);
        const uint32_t hi = ((ql[i] >> 4) & 0x0f0f0f0fu) | (qs & 0x30303030u);
        if constexpr (DP4A_32) {
            s[h] = dp4a(kMinus32, xl[i], dp4a(int(lo), xl[i], s[h]));
            s[2 + h] = dp4a(kMinus32, xh[i], dp4a(int(hi), xh[i], s[2 + h]));
        } else {
            s[h] = dp4a(int(minus32_bytes(lo)), xl[i], s[h]);
            s[2 + h] = dp4a(int(minus32_bytes(hi)), xh[i], s[2 + h]);
        }
    }
}

// The chunk's value from its four integer sums: sc its four int8 scales (sub-block 2g's two, 2g + 1's two), d
// the block's; the x scales of both sub-blocks (sub = 2g: even) are one aligned float4.
__device__ __forceinline__ float q6k_scale(uint32_t sc, float d, int sub, const float2* __restrict__ ds,
                                           const int (&s)[4]) {
    const float4 xd = *(const float4*)(ds + sub);
    return d * (xd.x * (float(int8_t(sc & 0xff)) * float(s[0]) + float(int8_t(sc >> 8)) * float(s[1])) +
                xd.z * (float(int8_t(sc >> 16)) * float(s[2]) + float(int8_t(sc >> 24)) * float(s[3])));
}

// Chunk c of a weight row dotted with x (xq: the row's int8 values, ds: its block scales).
// Q6 (Q6_K only): how its chunk is read and offset (above).
template <int T, int Q6 = kQ6Words>
__device__ __forceinline__ float chunk_dot(const uint8_t* __restrict__ row, int c, const int8_t* __restrict__ xq,
                                           const float2* __restrict__ ds) {
    if constexpr (T == GGML_TYPE_Q8_0) {
        const uint8_t* b = row + int64_t(c) * 34;
        uint32_t w[8];
        load_a2<8>(b + 2, w);
        const int4 x0 = ((const int4*)(xq + c * 32))[0], x1 = ((const int4*)(xq + c * 32))[1];
        int s = dp4a(int(w[0]), x0.x, 0);
        s = dp4a(int(w[1]), x0.y, s), s = dp4a(int(w[2]), x0.z, s), s = dp4a(int(w[3]), x0.w, s);
        s = dp4a(int(w[4]), x1.x, s), s = dp4a(int(w[5]), x1.y, s), s = dp4a(int(w[6]), x1.z, s);
        s = dp4a(int(w[7]), x1.w, s);
        return f16_at(b) * ds[c].x * float(s);
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q5_0) {
        // values 0..15: low nibbles, 16..31: high nibbles; w = d * (q - 8) (Q4_0) or d * (q - 16) (Q5_0)
        const uint8_t* b = row + int64_t(c) * Block<T>::bytes;
        uint32_t w[5], qh = 0;  // Q5_0: qh, then the 16 bytes of nibbles
        if constexpr (T == GGML_TYPE_Q4_0) {
            load_a2<4>(b + 2, w + 1);
        } else {
            load_a2<5>(b + 2, w);
            qh = w[0];
        }
        const int4 x0 = ((const int4*)(xq + c * 32))[0], x1 = ((const int4*)(xq + c * 32))[1];
        const int xl[4] = {x0.x, x0.y, x0.z, x0.w}, xh[4] = {x1.x, x1.y, x1.z, x1.w};
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int lo = int(w[i + 1] & 0x0f0f0f0fu), hi = int((w[i + 1] >> 4) & 0x0f0f0f0fu);
            if constexpr (T == GGML_TYPE_Q5_0) {
                lo |= spread4((qh >> (4 * i)) & 0xf);
                hi |= spread4((qh >> (16 + 4 * i)) & 0xf);
            }
            s = dp4a(lo, xl[i], s);
            s = dp4a(hi, xh[i], s);
        }
        const float2 xd = ds[c];
        return f16_at(b) * (xd.x * float(s) - (T == GGML_TYPE_Q4_0 ? 8.0f : 16.0f) * xd.y);
    } else if constexpr (T == GGML_TYPE_Q4_K) {
        return q4k_dot(q4k_load(row, c), c, xq, ds);
    } else {
        // Q6_K (the device layout, q6k_layout.cuh): chunk = sub-blocks 2g and 2g + 1 of super-block c / 4 (g = c %
        // 4): the low and the high nibbles of the same 32 bytes of ql', with the chunk's 16 bytes of qh' (two bits
        // of each value), each run 16-byte aligned; w = d * sc * (q - 32), one int8 scale per 16 values.
        const Q6kAt at = q6k_at(row, c);
        int s[4] = {0, 0, 0, 0};  // (2g, values 0-15), (2g, 16-31), (2g + 1, 0-15), (2g + 1, 16-31)
        uint4 ql2[2];
        if constexpr (Q6 != kQ6Words) ql2[0] = at.ql[0], ql2[1] = at.ql[1];
        const uint4 qh = *at.qh;
#pragma unroll
        for (int h = 0; h < 2; h++)  // 16 bytes of ql at a time
            q6k_half<Q6 == kQ6WideDp4a>(Q6 != kQ6Words ? ql2[h] : at.ql[h], qh, xq + at.sub * 32, h, s);
        return q6k_scale(*(const uint32_t*)(at.b + at.sc), f16_at(at.b + at.d), at.sub, ds, s);
    }
}

// The stream kernel's chunks.  A lane's chunks of a row are c0, c0 + 32, c0 + 64, ... (32 chunks: 8 super-blocks),
// so where a chunk lies inside its super-block -- which 32 bytes of quants, which scales, and for Q6_K the
// rotation of the aligned layout (q6k_pre: the super-block's index mod 8) -- is the same for all of them: a Lane
// holds it, and the loads walk a pointer by 8 super-blocks a chunk.  The arithmetic is chunk_dot's (q4k_dot; the
// Q6_K branch with kQ6WideDp4a): the same bits.
template <int T> struct Stream;

template <> struct Stream<GGML_TYPE_Q4_K> {
    static constexpr int kBytes = 144;
    using Chunk = Q4kChunk;
    struct Lane { int q; };
    static __device__ __forceinline__ Lane lane(int c0) { return Lane{16 + 32 * (c0 % 4)}; }
    static __device__ __forceinline__ Chunk load(const uint8_t* __restrict__ b, const Lane& L) {
        const uint4* q = (const uint4*)(b + L.q);
        return Chunk{*(const uint4*)b, q[0], q[1]};
    }
    static __device__ __forceinline__ float dot(const Chunk& w, int c, const Lane&, const XQ& x) {
        return q4k_dot(w, c, x.q, x.ds);
    }
};

template <> struct Stream<GGML_TYPE_Q6_K> {
    static constexpr int kBytes = 210;
    struct Chunk {
        uint4 ql[2], qh;
        uint32_t sc, d;
    };
    // byte offsets in the super-block and the first sub-block j = 2g, as in q6k_at, whose arithmetic this
    // repeats: computing q6k_at from a shared helper changed the SASS of half the matvec kernels (the Q6_K
    // builds among them), so the two stay apart -- change both together
    struct Lane { int ql, qh, sc, d, j; };
    static __device__ __forceinline__ Lane lane(int c0) {
        const int pre = q6k_pre(c0 / 4), g = c0 % 4;
        return Lane{pre + 32 * g, pre + 128 + 16 * g, q6k_sc(g, pre), q6k_d(pre), 2 * g};
    }
    static __device__ __forceinline__ Chunk load(const uint8_t* __restrict__ b, const Lane& L) {
        const uint4* ql = (const uint4*)(b + L.ql);
        return Chunk{{ql[0], ql[1]}, *(const uint4*)(b + L.qh), *(const uint32_t*)(b + L.sc),
                     *(const uint16_t*)(b + L.d)};
    }
    static __device__ __forceinline__ float dot(const Chunk& w, int c, const Lane& L, const XQ& x) {
        const int sub = (c / 4) * 8 + L.j;
        int s[4] = {0, 0, 0, 0};
#pragma unroll
        for (int h = 0; h < 2; h++) q6k_half<true>(w.ql[h], w.qh, x.q + sub * 32, h, s);
        return q6k_scale(w.sc, h2f(w.d), sub, x.ds, s);
    }
};

}  // namespace minfer::cuda
