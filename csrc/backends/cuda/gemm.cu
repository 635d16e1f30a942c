// Prefill's matrix products on the tensor cores: the weight is dequantized to
// f16 once per call (every later token reuses it), the activations are rounded
// to f16, and a tiled WMMA kernel accumulates in f32.
//
// Tiles: 128 x 128 outputs per block of 8 warps (2 x 4), each warp 64 x 32 =
// 4 x 2 fragments of 16 x 16; K in steps of 32, double-buffered in shared
// memory (the next tile is loaded into registers while this one is used).
// Rows are padded to 40 halves so fragment loads do not conflict on banks.
#include <mma.h>

#include "backends/cuda/dequant.cuh"
#include "backends/cuda/kernels.h"

namespace minfer::cuda {

namespace {

using namespace nvcuda;

template <int T>
__global__ void dequantize_f16_kernel(const uint8_t* __restrict__ W, int64_t N, int64_t K, int64_t rb,
                                      __half* __restrict__ out) {
    const int64_t chunks = K / 8;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N * chunks) return;
    const int64_t o = i / chunks, c = i % chunks;
    float w[8];
    dequant8<T>(W + o * rb, c * 8, w);
    __align__(16) __half h[8];
#pragma unroll
    for (int j = 0; j < 8; j++) h[j] = __float2half_rn(w[j]);
    *(uint4*)(out + o * K + c * 8) = *(const uint4*)h;
}

__global__ void convert_f16_kernel(const float* __restrict__ x, int64_t ldx, int64_t M, int64_t K,
                                   __half* __restrict__ out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= M * K) return;
    const int64_t r = i / K, c = i % K;
    out[i] = __float2half_rn(x[r * ldx + c]);
}

constexpr int BM = 128, BN = 128, BK = 32, LDS = BK + 8, kThreads = 256;

// Loads rows [row0, row0 + 128) x [k0, k0 + 32) of a [rows, K] f16 matrix: 2 x 16 bytes per thread,
// zeros past the last row.
__device__ __forceinline__ void load_tile(const __half* __restrict__ src, int64_t rows, int64_t K, int64_t row0,
                                          int64_t k0, uint4 reg[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int idx = threadIdx.x + i * kThreads;  // 0..511: row idx / 4, 8-half column group idx % 4
        const int64_t r = row0 + idx / 4;
        reg[i] = r < rows ? *(const uint4*)(src + r * K + k0 + (idx % 4) * 8) : make_uint4(0, 0, 0, 0);
    }
}
__device__ __forceinline__ void store_tile(__half (*dst)[LDS], const uint4 reg[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int idx = threadIdx.x + i * kThreads;
        *(uint4*)&dst[idx / 4][(idx % 4) * 8] = reg[i];
    }
}

// blockIdx.z takes K range [z * k_len, (z + 1) * k_len); with split K each
// range writes its own partial [M, N] (y + z * M * N, no bias) for gemm_reduce.
__global__ void __launch_bounds__(kThreads) gemm_f16_kernel(const __half* __restrict__ A, const __half* __restrict__ B,
                                                            int64_t M, int64_t N, int64_t K, int64_t k_len,
                                                            float* __restrict__ y, int64_t ldy,
                                                            const float* __restrict__ bias) {
    __shared__ __align__(128) __half As[2][BM][LDS];
    __shared__ __align__(128) __half Bs[2][BN][LDS];
    const int warp = threadIdx.x >> 5, wm = warp / 4, wn = warp % 4;
    const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    const int64_t kb = int64_t(blockIdx.z) * k_len;
    if (gridDim.z > 1) y += int64_t(blockIdx.z) * M * N;
    uint4 ra[2], rb[2];
    load_tile(A, M, K, m0, kb, ra);
    load_tile(B, N, K, n0, kb, rb);
    store_tile(As[0], ra);
    store_tile(Bs[0], rb);
    __syncthreads();
    const int64_t steps = k_len / BK;
    for (int64_t t = 0; t < steps; t++) {
        const int cur = int(t & 1);
        if (t + 1 < steps) {  // fetch the next K slice while this one is multiplied
            load_tile(A, M, K, m0, kb + (t + 1) * BK, ra);
            load_tile(B, N, K, n0, kb + (t + 1) * BK, rb);
        }
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 4; i++) wmma::load_matrix_sync(fa[i], &As[cur][wm * 64 + i * 16][kk], LDS);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &Bs[cur][wn * 32 + j * 16][kk], LDS);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        if (t + 1 < steps) {
            store_tile(As[cur ^ 1], ra);
            store_tile(Bs[cur ^ 1], rb);
        }
        __syncthreads();
    }

    // Epilogue through a per-warp 16 x 16 staging tile (bounds and bias per element).
    float* stage = (float*)&As[0][0][0] + warp * 256;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            const int64_t r0 = m0 + wm * 64 + i * 16, c0 = n0 + wn * 32 + j * 16;
            for (int e = lane; e < 256; e += 32) {
                const int64_t r = r0 + e / 16, c = c0 + e % 16;
                if (r < M && c < N) y[r * ldy + c] = stage[e] + (bias ? bias[c] : 0.0f);
            }
            __syncwarp();
        }
}

// y = sum over the splits of the partials (in split order: deterministic) + bias.
__global__ void gemm_reduce_kernel(const float* __restrict__ part, int splits, int64_t M, int64_t N,
                                   float* __restrict__ y, int64_t ldy, const float* __restrict__ bias) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    float s = bias ? bias[i % N] : 0.0f;
    for (int z = 0; z < splits; z++) s += part[int64_t(z) * M * N + i];
    y[(i / N) * ldy + i % N] = s;
}

}  // namespace

int gemm_splits(int64_t M, int64_t N, int64_t K) {
    // Small grids (few output tiles, long K) leave SMs idle: split K so there are ~2 blocks per SM.
    const int64_t tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    int splits = 1;
    while (splits < 8 && tiles * splits * 2 <= 264 && K % (int64_t(splits) * 2 * BK) == 0 &&
           K / (splits * 2) >= 512)
        splits *= 2;
    return splits;
}

void dequantize_f16(uint32_t wtype, const uint8_t* W, int64_t N, int64_t K, __half* out, cudaStream_t s) {
    const int64_t n = N * (K / 8);
    const unsigned grid = unsigned((n + 255) / 256);
    const int64_t rb = row_bytes(wtype, K);
    switch (wtype) {
#define X(t) case t: dequantize_f16_kernel<t><<<grid, 256, 0, s>>>(W, N, K, rb, out); break;
        MINFER_CUDA_TYPES(X)
#undef X
        default: throw MinferError(strfmt("CUDA dequantize: weight type %u is not supported", wtype));
    }
    check_launch("dequantize_f16");
}

void convert_f16(const float* x, int64_t ldx, int64_t M, int64_t K, __half* out, cudaStream_t s) {
    convert_f16_kernel<<<unsigned((M * K + 255) / 256), 256, 0, s>>>(x, ldx, M, K, out);
    check_launch("convert_f16");
}

void gemm_f16(const __half* A, const __half* B, int64_t M, int64_t N, int64_t K, float* y, int64_t ldy,
              const float* bias, float* partial, cudaStream_t s) {
    if (K % BK) throw MinferError(strfmt("CUDA gemm: K = %lld is not a multiple of %d", (long long)K, BK));
    const int splits = partial ? gemm_splits(M, N, K) : 1;
    const dim3 grid(unsigned((N + BN - 1) / BN), unsigned((M + BM - 1) / BM), unsigned(splits));
    if (splits == 1) {
        gemm_f16_kernel<<<grid, kThreads, 0, s>>>(A, B, M, N, K, K, y, ldy, bias);
        return check_launch("gemm_f16");
    }
    gemm_f16_kernel<<<grid, kThreads, 0, s>>>(A, B, M, N, K, K / splits, partial, N, nullptr);
    check_launch("gemm_f16 (split K)");
    gemm_reduce_kernel<<<unsigned((M * N + 255) / 256), 256, 0, s>>>(partial, splits, M, N, y, ldy, bias);
    check_launch("gemm_reduce");
}

}  // namespace minfer::cuda
