// Prefill's matrix products on the tensor cores: the weight is dequantized to
// f16 once per call (every later token reuses it), the activations are rounded
// to f16, and a tiled WMMA kernel accumulates in f32.
//
// Tiles: 128 x 128 outputs per block of 4 warps (2 x 2), each warp 64 x 64 =
// 4 x 4 fragments of 16 x 16 (eight fragment loads per 16 products, where 64 x
// 32 warps needed six per 8); K in slices of 32 through a three-deep cp.async
// ring in shared memory (20 KB a stage, 60 KB a block: three blocks per SM).  Rows are
// padded to 40 halves so fragment loads do not conflict on banks.  Blocks walk
// M fastest, so the blocks in flight share each weight tile through L2.
//
// A batch's decode step (5-64 rows) cannot pay for dequantizing every weight to f16 in memory first: its
// product reads each weight once.  gemm_q takes 32 weight rows a block, dequantizes each K slice of them
// into shared memory as f16, and multiplies it with the slice of all (up to 64) activation rows on the tensor
// cores; K is split over blocks until there are four a SM (its loads are not pipelined: other blocks' hide
// their latency).  Reference: float64 numpy;
// tests/test_cuda_matvec.py (the gemm path).
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

constexpr int BM = 128, BN = 128, BK = 32, LDS = BK + 8, kThreads = 128;
constexpr int kWarpsN = 2, FM = 4, FN = 4;  // 2 x 2 warps, each FM x FN fragments

// One 16-byte cp.async (global -> shared, bypassing L1); src_bytes 0 fills the 16 bytes with zeros (rows past
// the matrix's end, whose address is clamped to a valid one).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const unsigned s = unsigned(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

constexpr int kStages = 3;  // K slices in flight: two loading while one is multiplied
constexpr int kTileHalves = BM * LDS;  // one operand's slice in shared memory (BM == BN)
constexpr size_t kGemmSmem = size_t(kStages) * 2 * kTileHalves * sizeof(__half);  // 60 KB: above the 48 KB default
static_assert(kWarpsN * FN * 16 == BN && (kThreads / 32 / kWarpsN) * FM * 16 == BM, "the warps cover the tile");

// Issues the copies of rows [row0, row0 + 128) x [k0, k0 + 32) of a [rows, K] f16 matrix into dst: four
// 16-byte pieces per thread.
__device__ __forceinline__ void load_slice(const __half* __restrict__ src, int64_t rows, int64_t K, int64_t row0,
                                           int64_t k0, __half* dst) {
    constexpr int per_row = BK / 8;
#pragma unroll
    for (int i = 0; i < BM * per_row / kThreads; i++) {
        const int idx = threadIdx.x + i * kThreads;
        const int64_t r = row0 + idx / per_row;
        const __half* g = src + (r < rows ? r : rows - 1) * K + k0 + (idx % per_row) * 8;
        cp_async16(dst + (idx / per_row) * LDS + (idx % per_row) * 8, g, r < rows ? 16 : 0);
    }
}

// blockIdx.z takes K range [z * k_len, (z + 1) * k_len); with split K each
// range writes its own partial [M, N] (y + z * M * N, no bias) for gemm_reduce.
// The K slices stream through a kStages-deep ring of shared-memory buffers
// filled by cp.async: the copies of slices t+1 and t+2 are in flight while
// slice t is multiplied (the register-staged double buffer this replaced kept
// one).  blockIdx.x walks M, blockIdx.y N.
__global__ void __launch_bounds__(kThreads) gemm_f16_kernel(const __half* __restrict__ A, const __half* __restrict__ B,
                                                            int64_t M, int64_t N, int64_t K, int64_t k_len,
                                                            float* __restrict__ y, int64_t ldy,
                                                            const float* __restrict__ bias) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __half* smem = (__half*)smem_raw;  // stage s: A slice at 2s, B slice at 2s + 1 (kTileHalves each)
    const int warp = threadIdx.x >> 5, wm = warp / kWarpsN, wn = warp % kWarpsN;
    const int64_t m0 = int64_t(blockIdx.x) * BM, n0 = int64_t(blockIdx.y) * BN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    const int64_t kb = int64_t(blockIdx.z) * k_len;
    if (gridDim.z > 1) y += int64_t(blockIdx.z) * M * N;
    const int64_t steps = k_len / BK;
    auto issue = [&](int64_t t) {  // slice t into stage t % kStages; one commit group per call, empty or not
        if (t < steps) {
            __half* st = smem + (t % kStages) * 2 * kTileHalves;
            load_slice(A, M, K, m0, kb + t * BK, st);
            load_slice(B, N, K, n0, kb + t * BK, st + kTileHalves);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int t = 0; t < kStages - 1; t++) issue(t);
    for (int64_t t = 0; t < steps; t++) {
        cp_async_wait<kStages - 2>();  // slice t has landed (group t + 1 may still be in flight)
        __syncthreads();               // ... for every thread; and every warp is done with slice t - 1
        issue(t + kStages - 1);        // into the stage slice t - 1 used
        const __half* As = smem + (t % kStages) * 2 * kTileHalves;
        const __half* Bs = As + kTileHalves;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[FN];
#pragma unroll
            for (int i = 0; i < FM; i++) wmma::load_matrix_sync(fa[i], As + (wm * 16 * FM + i * 16) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::load_matrix_sync(fb[j], Bs + (wn * 16 * FN + j * 16) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < FM; i++)
#pragma unroll
                for (int j = 0; j < FN; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free: reused as the epilogue's staging

    // Epilogue through a per-warp 16 x 16 staging tile (bounds and bias per element).
    float* stage = (float*)smem_raw + warp * 256;  // 4 KB of the ring
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            const int64_t r0 = m0 + wm * 16 * FM + i * 16, c0 = n0 + wn * 16 * FN + j * 16;
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

constexpr int QM = 64, QN = 32, QK = 64, QLDS = QK + 8, kQThreads = 128;

// y[M, N] (+ bias) = X[M, K] (f16) W[N, K]^T, W quantized (rows rb bytes apart); blockIdx.x takes 32 weight
// rows, blockIdx.z the K range [z k_len, (z + 1) k_len) (with several, partials at y + z M N for the reduce).
template <int T>
__global__ void __launch_bounds__(kQThreads) gemm_q_kernel(const __half* __restrict__ X, int64_t M,
                                                           const uint8_t* __restrict__ W, int64_t rb, int64_t N,
                                                           int64_t K, int64_t k_len, float* __restrict__ y,
                                                           int64_t ldy, const float* __restrict__ bias) {
    __shared__ __align__(128) __half Xs[QM * QLDS];
    __shared__ __align__(128) __half Ws[QN * QLDS];
    const int warp = threadIdx.x >> 5;  // warp w: activation rows 16w.. 16w + 15 against the 32 weight rows
    const int64_t n0 = int64_t(blockIdx.x) * QN, kb = int64_t(blockIdx.z) * k_len;
    if (gridDim.z > 1) y += int64_t(blockIdx.z) * M * N;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
#pragma unroll
    for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[j], 0.0f);
    for (int64_t k0 = kb; k0 < kb + k_len; k0 += QK) {
#pragma unroll
        for (int i = 0; i < QM * QK / 8 / kQThreads; i++) {  // 8 values of X a thread and pass
            const int idx = threadIdx.x + i * kQThreads, r = idx / (QK / 8), c = (idx % (QK / 8)) * 8;
            *(uint4*)(Xs + r * QLDS + c) = r < M ? *(const uint4*)(X + r * K + k0 + c) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < QN * QK / 8 / kQThreads; i++) {  // and of W, dequantized
            const int idx = threadIdx.x + i * kQThreads, r = idx / (QK / 8), c = (idx % (QK / 8)) * 8;
            __align__(16) __half h[8];
            if (n0 + r < N) {
                float w[8];
                dequant8<T>(W + (n0 + r) * rb, k0 + c, w);
#pragma unroll
                for (int j = 0; j < 8; j++) h[j] = __float2half_rn(w[j]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) h[j] = __float2half_rn(0.0f);
            }
            *(uint4*)(Ws + r * QLDS + c) = *(const uint4*)h;
        }
        __syncthreads();
        if (warp * 16 < M) {  // warps past the step's rows have nothing to multiply
#pragma unroll
            for (int kk = 0; kk < QK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
                wmma::load_matrix_sync(fa, Xs + warp * 16 * QLDS + kk, QLDS);
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], Ws + j * 16 * QLDS + kk, QLDS);
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[j], fa, fb[j], acc[j]);
            }
        }
        __syncthreads();  // the slices are rewritten next
    }
    if (warp * 16 >= M) return;
    float* stage = (float*)Xs + warp * 256;  // 1 KB a warp of the (now free) X slice
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        wmma::store_matrix_sync(stage, acc[j], 16, wmma::mem_row_major);
        __syncwarp();
        const int64_t r0 = warp * 16, c0 = n0 + j * 16;
        for (int e = lane; e < 256; e += 32) {
            const int64_t r = r0 + e / 16, c = c0 + e % 16;
            if (r < M && c < N) y[r * ldy + c] = stage[e] + (bias && gridDim.z == 1 ? bias[c] : 0.0f);
        }
        __syncwarp();
    }
}

}  // namespace

bool gemm_q_fits(int64_t M, int64_t K) { return M >= 1 && M <= QM && K % QK == 0; }

int gemm_q_splits(int64_t M, int64_t N, int64_t K) {
    // four blocks per SM: split K while the grid is smaller and each range keeps four slices or more
    const int64_t blocks = (N + QN - 1) / QN, want = 4 * int64_t(sm_count());
    int splits = 1;
    while (splits < 16 && blocks * splits < want && K % (int64_t(splits) * 2 * QK) == 0 && K / (splits * 2) >= 256)
        splits *= 2;
    return splits;
}

void gemm_q(uint32_t wtype, const __half* xh, int64_t M, const uint8_t* W, int64_t N, int64_t K, float* y, int64_t ldy,
            const float* bias, float* partial, cudaStream_t s) {
    if (!gemm_q_fits(M, K))
        throw MinferError(strfmt("CUDA gemm_q: %lld rows of width %lld (1..%d rows, width a multiple of %d)", (long long)M,
                                 (long long)K, QM, QK));
    const int splits = partial ? gemm_q_splits(M, N, K) : 1;
    const dim3 grid(unsigned((N + QN - 1) / QN), 1u, unsigned(splits));
    const int64_t rb = row_bytes(wtype, K);
    float* out = splits > 1 ? partial : y;
    const int64_t ld = splits > 1 ? N : ldy;
    switch (wtype) {
#define X(t) case t: gemm_q_kernel<t><<<grid, kQThreads, 0, s>>>(xh, M, W, rb, N, K, K / splits, out, ld, bias); break;
        MINFER_CUDA_TYPES(X)
#undef X
        default: throw MinferError(strfmt("CUDA gemm_q: weight type %u is not supported", wtype));
    }
    check_launch("gemm_q");
    if (splits > 1) gemm_reduce(partial, splits, M, N, y, ldy, bias, s);
}

void gemm_reduce(const float* partial, int splits, int64_t M, int64_t N, float* y, int64_t ldy, const float* bias,
                 cudaStream_t s) {
    gemm_reduce_kernel<<<unsigned((M * N + 255) / 256), 256, 0, s>>>(partial, splits, M, N, y, ldy, bias);
    check_launch("gemm_reduce");
}

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
    const dim3 grid(unsigned((M + BM - 1) / BM), unsigned((N + BN - 1) / BN), unsigned(splits));
    static const bool smem_ok = [] {  // once per process: the ring needs more than the default 48 KB
        const cudaError_t e = cudaFuncSetAttribute(gemm_f16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kGemmSmem));
        if (e != cudaSuccess)
            throw MinferError(strfmt("CUDA: gemm_f16 cannot have %zu bytes of shared memory: %s", kGemmSmem, cudaGetErrorString(e)));
        return true;
    }();
    (void)smem_ok;
    if (splits == 1) {
        gemm_f16_kernel<<<grid, kThreads, kGemmSmem, s>>>(A, B, M, N, K, K, y, ldy, bias);
        return check_launch("gemm_f16");
    }
    gemm_f16_kernel<<<grid, kThreads, kGemmSmem, s>>>(A, B, M, N, K, K / splits, partial, N, nullptr);
    check_launch("gemm_f16 (split K)");
    gemm_reduce(partial, splits, M, N, y, ldy, bias, s);
}

}  // namespace minfer::cuda
