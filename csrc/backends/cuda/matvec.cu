// Decode's matrix-vector products: y[r, o] = x[r, :] . W[o, :] for a few
// activation rows r, bound by streaming the weights from HBM once.
//
// A block of 8 warps owns 8 weight rows, a warp each.  K is walked in tiles:
// the block stages the tile of every activation row in shared memory (read
// from L2 once per block instead of once per weight row -- x is 4 bytes a
// value against ~0.6 for the weights, so re-reading it was the bottleneck),
// then each lane takes 32-weight units of its row (one block, or one
// sub-block of a K-quant: decode_unit, wide loads, scales applied once per
// unit) and dots them with the staged x.  The staged rows are padded by 4 floats per 32 values so
// the lanes' float4 reads fall in different banks.
//
// Several weights ("parts", any types, same K) share one launch: the fused
// QKV projection writes q, k and v into column windows of one output; the
// fused FFN computes gate and up rows together and writes silu(gate) * up.  Reference: float64 numpy;
// tests/test_cuda_matvec.py (the f32 path).
#include "backends/cuda/dequant.cuh"
#include "backends/cuda/unit_decode.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/matvec_rows.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace minfer::cuda {

namespace {

constexpr int kWarps = kMatvecWarps, kR = kMatvecMaxRows;
constexpr int kTileFloats = 8192;  // staged x per block: 8192 values + padding = 36 KB

__host__ __device__ __forceinline__ int padded(int v) { return v + (v >> 5) * 4; }

template <int T>
__device__ __forceinline__ void unit_dots(const uint8_t* __restrict__ w, int64_t u_first, int u0, int ustep, int units,
                                          const float* xs, int64_t xs_stride, int xs_unit, int n_rows,
                                          float (&acc)[kR]) {
    for (int u = u0; u < units; u += ustep) {
        Unit U;
        decode_unit<T>(w, u_first + u, U);
#pragma unroll
        for (int r = 0; r < kR; r++) {
            if (r < n_rows) {
                const float4* xr = (const float4*)(xs + r * xs_stride + u * xs_unit);
                float lo = 0.0f, hi = 0.0f, sx = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float4 v = xr[i];
                    float& s = i < 4 ? lo : hi;
                    s += U.q[4 * i] * v.x + U.q[4 * i + 1] * v.y + U.q[4 * i + 2] * v.z + U.q[4 * i + 3] * v.w;
                    if constexpr (unit_has_offset<T>()) sx += (v.x + v.y) + (v.z + v.w);
                }
                acc[r] += U.a_lo * lo + U.a_hi * hi - (unit_has_offset<T>() ? U.b * sx : 0.0f);
            }
        }
    }
}

__device__ __forceinline__ void unit_dots_any(uint32_t type, const uint8_t* w, int64_t u_first, int u0, int ustep,
                                              int units, const float* xs, int64_t xs_stride, int xs_unit, int n_rows,
                                              float (&acc)[kR]) {
    switch (type) {
#define X(t) case t: unit_dots<t>(w, u_first, u0, ustep, units, xs, xs_stride, xs_unit, n_rows, acc); break;
        MINFER_CUDA_TYPES(X)
#undef X
        default: break;
    }
}

// wpr warps share a row (each a strided share of its units), 8 / wpr rows per block; the launch uses one warp a
// row with x staged (the best of 1, 2, 4 and 8 warps a row, staged or not).  The parameters stay: fixing them at
// compile time unrolls further and spills more.
__global__ void __launch_bounds__(32 * kWarps, 3) matvec_kernel(MatvecArgs a, int tile, int wpr, bool stage) {
    pdl_start();
    extern __shared__ __align__(16) float xs[];
    __shared__ float red[kWarps][2 * kR];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = warp % wpr;
    const int xs_stride = padded(tile);
    const WarpRow row = warp_row(a, int64_t(blockIdx.x) * (kWarps / wpr) + warp / wpr);
    const bool live = row.live;
    const int64_t o = row.o;
    const MatvecPart& A = a.part[row.p];
    float acc[kR], acc2[kR];
#pragma unroll
    for (int r = 0; r < kR; r++) acc[r] = acc2[r] = 0.0f;
    for (int64_t k0 = 0; k0 < a.K; k0 += tile) {
        const int kt = int(min(int64_t(tile), a.K - k0));
        const float* xt = a.x + k0;  // unstaged: x straight from global memory (L1/L2)
        int64_t xt_stride = a.ldx;
        int xt_unit = 32;
        if (stage) {
            __syncthreads();  // the previous tile is no longer read
            for (int e = threadIdx.x; e < a.n_rows * kt / 4; e += 32 * kWarps) {
                const int r = e / (kt / 4), v = (e % (kt / 4)) * 4;
                *(float4*)(xs + r * xs_stride + padded(v)) = *(const float4*)(a.x + r * a.ldx + k0 + v);
            }
            __syncthreads();
            xt = xs, xt_stride = xs_stride, xt_unit = 36;
        }
        if (live) {
            unit_dots_any(A.type, A.W + o * A.rb, k0 / 32, sub * 32 + lane, 32 * wpr, kt / 32, xt, xt_stride, xt_unit,
                          a.n_rows, acc);
            if (a.swiglu)
                unit_dots_any(a.part[1].type, a.part[1].W + o * a.part[1].rb, k0 / 32, sub * 32 + lane, 32 * wpr,
                              kt / 32, xt, xt_stride, xt_unit, a.n_rows, acc2);
        }
    }
#pragma unroll
    for (int r = 0; r < kR; r++) {
        acc[r] = warp_sum(acc[r]);
        acc2[r] = warp_sum(acc2[r]);
    }
    if (wpr > 1) {  // the row's warps meet in shared memory (every thread reaches the barrier)
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < kR; r++) red[warp][r] = acc[r], red[warp][kR + r] = acc2[r];
        __syncthreads();
        if (sub == 0 && lane == 0)
#pragma unroll
            for (int r = 0; r < kR; r++)
                for (int w = 1; w < wpr; w++) acc[r] += red[warp + w][r], acc2[r] += red[warp + w][kR + r];
    }
    if (live && sub == 0 && lane == 0) store_warp_row(a, row, acc, acc2);
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
    if (type == GGML_TYPE_Q6_K) return q6k_row_bytes(cols);  // padded to 16 bytes on the device (q6k_layout.cuh)
    switch (type) {
#define X(t) case t: return cols / Block<t>::values * Block<t>::bytes;
        MINFER_CUDA_TYPES(X)
#undef X
        default: throw MinferError(strfmt("CUDA: weight type %u is not supported", type));
    }
}

void lay_rows(uint32_t type, const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
    if (type == GGML_TYPE_Q6_K) q6k_lay_rows(src, dst, rows, cols);
    else std::memcpy(dst, src, size_t(rows) * size_t(row_bytes(type, cols)));
}

void matvec(const MatvecArgs& a, cudaStream_t s) {
    if (a.n_rows < 1 || a.n_rows > kMatvecMaxRows || a.K % 32 || (uintptr_t(a.x) % 16) || a.ldx % 4)
        throw MinferError(strfmt("CUDA matvec: %d rows of width %lld, ld %lld (1..%d rows; width a multiple of 32; "
                                 "16-byte aligned rows)", a.n_rows, (long long)a.K, (long long)a.ldx, kMatvecMaxRows));
    // K tile: as much of K as fits kTileFloats for all the activation rows, in whole 32-value units.
    int tile = int(std::min<int64_t>(a.K, kTileFloats / a.n_rows / 32 * 32));
    int64_t rows = 0;
    if (a.swiglu) rows = a.part[0].n_out;
    else
        for (int p = 0; p < a.n_parts; p++) rows += a.part[p].n_out;
    const size_t smem = size_t(a.n_rows) * size_t(padded(tile)) * 4;
    launch("matvec", matvec_kernel, dim3(unsigned((rows + kWarps - 1) / kWarps)), dim3(32 * kWarps), smem, s, a, tile,
           1, true);
}

}  // namespace minfer::cuda
