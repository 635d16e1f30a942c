// What the two decode matvec kernels (matvec.cu: f32 activations,
// matvec_q8.cu: 8-bit activations) share: which weight row a warp computes
// when several parts share a launch, and how the row's result is stored; and
// how the 8-bit activations are made (by quantize_x, and by add_rmsnorm for
// the projection after it: one definition, so the two are identical).
#pragma once
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace minfer::cuda {

constexpr int kMatvecWarps = 8;  // warps per block, one output row each

// The weights a launch reads: gate and up with swiglu, else its n_parts parts.
__host__ __device__ inline int weight_parts(const MatvecArgs& a) { return a.swiglu ? 2 : a.n_parts; }

struct WarpRow {
    int p;       // the part
    int64_t o;   // row of that part (gate and up row o with swiglu)
    bool live;   // false past the last row
};

__device__ __forceinline__ WarpRow warp_row(const MatvecArgs& a, int64_t o) {
    int p = 0;
    if (!a.swiglu)
        while (p < a.n_parts && o >= a.part[p].n_out) o -= a.part[p++].n_out;
    const bool live = a.swiglu ? o < a.part[0].n_out : p < a.n_parts;
    return WarpRow{live ? p : 0, o, live};
}

// acc: the row's dot products with each activation row (acc2: the up row's, with swiglu).
__device__ __forceinline__ void store_warp_row(const MatvecArgs& a, const WarpRow& w, const float* acc,
                                               const float* acc2) {
    const MatvecPart& A = a.part[w.p];
    for (int r = 0; r < a.n_rows; r++) {
        if (a.swiglu) a.y[r * a.ldy + w.o] = acc[r] / (1.0f + expf(-acc[r])) * acc2[r];
        else a.y[r * a.ldy + A.y_col + w.o] = acc[r] + (A.bias ? A.bias[w.o] : 0.0f);
    }
}

// Value v (column col of row `row`, rows of K values) of a 32-value activation block whose values the lanes of
// one warp hold in order: q = round(v / d), d = the block's amax / 127 (half away from zero, as the CPU's
// quantizer); lane 0 writes (d, d * sum(q)) and -32 times the sums of the block's two halves (m16).  The sums
// are integers (|sum| <= 32 * 127): the halves' sum is the whole's in any order, exact in f32.
__device__ __forceinline__ void quantize_lane(float v, const Q8Act& q8, int64_t row, int64_t K, int64_t col) {
    const float d = warp_max(fabsf(v)) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int qi = int(roundf(v * id));
    q8.q[row * K + col] = int8_t(qi);
    int h = qi;  // the sum of this lane's half of the warp
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) h += __shfl_xor_sync(0xffffffffu, h, o);
    const int other = __shfl_xor_sync(0xffffffffu, h, 16);
    if ((threadIdx.x & 31) == 0) {
        const int64_t b = row * (K / 32) + col / 32;
        q8.ds[b] = make_float2(d, d * float(h + other));
        q8.m16[b] = make_int2(-32 * h, -32 * other);
    }
}

// The same for a warp whose lanes hold four consecutive values each (8 lanes per block of 32, col = the first):
// the same amax, d, q and sums, so the same bytes as quantize_lane.  Every lane of the warp calls it (the
// shuffles are warp-wide); `live` lanes write.
__device__ __forceinline__ void quantize_lane4(float4 v, bool live, const Q8Act& q8, int64_t row, int64_t K,
                                               int64_t col) {
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float d = m / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q0 = int(roundf(v.x * id)), q1 = int(roundf(v.y * id)), q2 = int(roundf(v.z * id)),
              q3 = int(roundf(v.w * id));
    int h = q0 + q1 + q2 + q3;  // then the sum of this lane's half of the block (4 lanes)
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) h += __shfl_xor_sync(0xffffffffu, h, o);
    const int other = __shfl_xor_sync(0xffffffffu, h, 4);
    if (!live) return;
    *(char4*)(q8.q + row * K + col) = make_char4(char(q0), char(q1), char(q2), char(q3));
    if ((threadIdx.x & 7) == 0) {
        const int64_t b = row * (K / 32) + col / 32;
        q8.ds[b] = make_float2(d, d * float(h + other));
        q8.m16[b] = make_int2(-32 * h, -32 * other);
    }
}

}  // namespace minfer::cuda
