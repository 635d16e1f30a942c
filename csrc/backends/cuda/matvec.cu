// Decode's matrix-vector products: y[r, o] = x[r, :] . W[o, :] for a few
// activation rows r, bound by streaming the weights from HBM once.
//
// A block of 256 threads is cut into teams of TPR threads (32..256, chosen
// from K so every team has a few 32-value units per thread).  A team owns two
// weight rows (o, o+1 of one weight, or gate o and up o for the fused FFN):
// its threads stride over K in 32-value units (one block, or one sub-block of
// a K-quant: four dequant8 reads issued together), dequantize the unit of both
// rows, then stream each activation row's 32 values as float4 and accumulate
// into both -- so every x load serves two rows.  Partial sums are reduced over
// the warp, then across the team's warps in shared memory.
//
// Several weights ("parts", any types, same K) share one launch: the fused
// QKV projection writes q, k and v into column windows of one output.
#include "backends/cuda/dequant.cuh"
#include "backends/cuda/kernels.h"

namespace minfer::cuda {

namespace {

constexpr int kThreads = 256, kR = kMatvecMaxRows;

template <int T>
__device__ __forceinline__ void team_dot(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1, int64_t K,
                                         const float* __restrict__ x, int64_t ldx, int n_rows, int t, int tpr,
                                         float (&acc)[2][kR]) {
    for (int64_t u = t; u < K / 32; u += tpr) {
        float a[32], b[32];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            dequant8<T>(w0, u * 32 + q * 8, a + q * 8);
            dequant8<T>(w1, u * 32 + q * 8, b + q * 8);
        }
#pragma unroll
        for (int r = 0; r < kR; r++) {
            if (r < n_rows) {
                const float4* xr = (const float4*)(x + r * ldx + u * 32);
                float sa = 0.0f, sb = 0.0f;
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    const float4 v = xr[q];
                    sa += a[4 * q] * v.x + a[4 * q + 1] * v.y + a[4 * q + 2] * v.z + a[4 * q + 3] * v.w;
                    sb += b[4 * q] * v.x + b[4 * q + 1] * v.y + b[4 * q + 2] * v.z + b[4 * q + 3] * v.w;
                }
                acc[0][r] += sa;
                acc[1][r] += sb;
            }
        }
    }
}

__global__ void __launch_bounds__(kThreads) matvec_kernel(MatvecArgs a, int tpr) {
    __shared__ float red[kThreads / 32][2 * kR];
    const int team = threadIdx.x / tpr, t = threadIdx.x % tpr, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t pair = int64_t(blockIdx.x) * (kThreads / tpr) + team;
    // Which part and rows this team owns (uniform over the team).
    int p = 0;
    int64_t o0 = 0, o1 = 0;
    bool live = true, second = true;
    if (a.swiglu) {
        o0 = o1 = pair;
        live = pair < a.part[0].n_out;
    } else {
        while (p < a.n_parts && pair >= (a.part[p].n_out + 1) / 2) pair -= (a.part[p++].n_out + 1) / 2;
        live = p < a.n_parts;
        if (live) {
            o0 = 2 * pair;
            second = o0 + 1 < a.part[p].n_out;
            o1 = second ? o0 + 1 : o0;
        }
    }
    float acc[2][kR];
#pragma unroll
    for (int r = 0; r < kR; r++) acc[0][r] = acc[1][r] = 0.0f;
    if (live) {
        const MatvecPart& A = a.part[p];
        const MatvecPart& B = a.swiglu ? a.part[1] : a.part[p];
        const uint8_t* w0 = A.W + o0 * A.rb;
        const uint8_t* w1 = B.W + o1 * B.rb;
        switch (A.type) {
#define X(ty) case ty: team_dot<ty>(w0, w1, a.K, a.x, a.ldx, a.n_rows, t, tpr, acc); break;
            MINFER_CUDA_TYPES(X)
#undef X
            default: break;
        }
    }
    // Reduce over the warp, then over the team's warps (all threads reach the barrier).
#pragma unroll
    for (int r = 0; r < kR; r++) {
        acc[0][r] = warp_sum(acc[0][r]);
        acc[1][r] = warp_sum(acc[1][r]);
    }
    if (tpr > 32) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < kR; r++) red[warp][r] = acc[0][r], red[warp][kR + r] = acc[1][r];
        __syncthreads();
        if (t == 0)
#pragma unroll
            for (int r = 0; r < kR; r++) {
                float s0 = 0.0f, s1 = 0.0f;
                for (int w = 1; w < tpr / 32; w++) s0 += red[warp + w][r], s1 += red[warp + w][kR + r];
                acc[0][r] += s0;
                acc[1][r] += s1;
            }
    }
    if (!live || t != 0) return;
    const MatvecPart& P = a.part[p];
    for (int r = 0; r < a.n_rows; r++) {
        float* yr = a.y + r * a.ldy;
        if (a.swiglu) {
            const float g = acc[0][r];
            yr[o0] = g / (1.0f + expf(-g)) * acc[1][r];
        } else {
            yr[P.y_col + o0] = acc[0][r] + (P.bias ? P.bias[o0] : 0.0f);
            if (second) yr[P.y_col + o1] = acc[1][r] + (P.bias ? P.bias[o1] : 0.0f);
        }
    }
}

}  // namespace

bool type_supported(uint32_t type) {
    switch (type) {
#define X(t) case t:
        MINFER_CUDA_TYPES(X)
#undef X
        return true;
        default: return false;
    }
}

int64_t row_bytes(uint32_t type, int64_t cols) {
    switch (type) {
#define X(t) case t: return cols / Block<t>::values * Block<t>::bytes;
        MINFER_CUDA_TYPES(X)
#undef X
        default: throw MinferError(strfmt("CUDA: weight type %u is not supported", type));
    }
}

void matvec(const MatvecArgs& a, cudaStream_t s) {
    if (a.n_rows < 1 || a.n_rows > kMatvecMaxRows || a.K % 32 || (uintptr_t(a.x) % 16) || a.ldx % 4)
        throw MinferError(strfmt("CUDA matvec: %d rows of width %lld, ld %lld (1..%d rows; width a multiple of 32; "
                                 "16-byte aligned rows)", a.n_rows, (long long)a.K, (long long)a.ldx, kMatvecMaxRows));
    if (a.swiglu && a.part[0].type != a.part[1].type)
        throw MinferError("CUDA matvec: the fused FFN needs gate and up of one type");
    // Threads per team: enough that each thread has ~4 units of K, at least a warp.
    const int64_t units = a.K / 32;
    int tpr = 32;
    while (tpr < kThreads && units / tpr > 4) tpr *= 2;
    int64_t pairs = 0;
    if (a.swiglu) pairs = a.part[0].n_out;
    else
        for (int p = 0; p < a.n_parts; p++) pairs += (a.part[p].n_out + 1) / 2;
    const int64_t per_block = kThreads / tpr;
    matvec_kernel<<<unsigned((pairs + per_block - 1) / per_block), kThreads, 0, s>>>(a, tpr);
    check_launch("matvec");
}

}  // namespace minfer::cuda
