// What the two decode matvec kernels (matvec.cu: f32 activations,
// matvec_q8.cu: 8-bit activations) share: which weight row a warp computes
// when several parts share a launch, and how the row's result is stored; and
// how the 8-bit activations are made (by quantize_x, and by add_rmsnorm for
// the projection after it: one definition, so the two are identical).  Tested through the matvecs
// (tests/test_cuda_matvec.py) and the fused norm (tests/test_cuda.py).
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
        if (a.swiglu) a.y[r * a.ldy + w.o] = (a.gelu ? gelu(acc[r]) : acc[r] / (1.0f + expf(-acc[r]))) * acc2[r];
        else a.y[r * a.ldy + A.y_col + w.o] = acc[r] + (A.bias ? A.bias[w.o] : 0.0f);
    }
}

// Value v of a 32-value activation block whose values the lanes of one warp hold in order: q = round(v / d),
// d = the block's amax / 127 (half away from zero, as the CPU's quantizer); lane 0 writes (d, d * sum(q)).
__device__ __forceinline__ void quantize_lane(float v, int8_t* q, float2* ds) {
    const float d = warp_max(fabsf(v)) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int qi = int(roundf(v * id));
    *q = int8_t(qi);
    const float s = warp_sum(float(qi));  // |sum| <= 32 * 127: exact in f32
    if ((threadIdx.x & 31) == 0) *ds = make_float2(d, d * s);
}

// The same for a warp whose lanes hold four consecutive values each (8 lanes per block of 32): the same amax,
// d, q and sum, so the same bytes as quantize_lane.  Every lane of the warp calls it (the shuffles are
// warp-wide); `live` lanes write.
__device__ __forceinline__ void quantize_lane4(float4 v, bool live, int8_t* q, float2* ds) {
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float d = m / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q0 = int(roundf(v.x * id)), q1 = int(roundf(v.y * id)), q2 = int(roundf(v.z * id)),
              q3 = int(roundf(v.w * id));
    float s = float(q0 + q1 + q2 + q3);  // |sum| <= 32 * 127: exact in f32, in any order
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (!live) return;
    *(char4*)q = make_char4(char(q0), char(q1), char(q2), char(q3));
    if ((threadIdx.x & 7) == 0) *ds = make_float2(d, d * s);
}

}  // namespace minfer::cuda
