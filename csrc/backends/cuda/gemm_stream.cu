// A batch's decode product streamed as decode streams one row: y[M, N] = x[M, K] W[N, K]^T for 1..16 activation
// rows in bf16 (mma_act's layout) and Q4_K or Q6_K weights, each weight byte read from memory once a call.
//
// No shared memory and no barrier.  A warp takes 16 weight rows (a lane rows g and g + 8) and a range of K, and
// keeps a ring of kDepth slices (a super-block of each row) in registers: it loads its lanes' bytes of slice
// s + kDepth straight from global memory as soon as it has multiplied slice s, so every warp always has slices
// in flight, as the one-row matvec does.  Each 32-value unit of a slice is decoded to bf16 fragments with its
// scales applied (mma_weights.cuh) and multiplied with every activation row by two mma.sync m16n8k16; the
// activations' fragments come from global memory through L1 (the warps of an SM walk K together, so x is read
// from L2 about once an SM a pass).  The shared-memory stages of gemm_mma wait on their barriers and the copy
// engine; here only the loads' latency is left, hidden by the ring.  K is split over blocks (partials summed in
// order by gemm_reduce) by the weight's shape alone, so a row's sums are the same bits at any batch size.  It
// serves 9-16 rows (two tiles of 8); with four tiles the activations' fragments outgrow the registers and the
// stages of gemm_mma win (benchmarks/NOTES.md).
//
// Reference: float64 numpy over the dequantized weights; tests/test_cuda_matvec.py (the stream path, with the
// bound of rounding x and the weights' scaled quants to bf16, as gemm_mma).
#include "backends/cuda/batch_gemm.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_weights.cuh"

namespace minfer::cuda {

namespace {

constexpr int kWarps = 4, kRows = 16 * kWarps;  // weight rows a block

__device__ __forceinline__ uint2 ldg64(const uint8_t* p) { return __ldg((const uint2*)p); }
__device__ __forceinline__ uint32_t ldg32(const uint8_t* p) { return __ldg((const unsigned*)p); }

// Per weight type: a slice's values and bytes, the ring's depth (registers: a Q6_K slice holds twice a Q4_K's),
// the registers a lane keeps of one row's slice (Raw), how it loads them from the slice at p (block sl of the
// row), and unit j's fragments from them.
template <int T> struct StreamW;

template <> struct StreamW<GGML_TYPE_Q4_K> {
    static constexpr int kSlice = 256, kBytes = 144;
    static constexpr int kDepth = 3;
    struct Raw { uint4 hdr; uint2 q[4]; };
    static __device__ __forceinline__ void load(Raw& r, const uint8_t* p, int64_t, int t) {
        r.hdr = __ldg((const uint4*)p);  // rows are 16-byte aligned and 144 = 9 x 16
#pragma unroll
        for (int g = 0; g < 4; g++) r.q[g] = ldg64(p + 16 + 32 * g + 8 * t);
    }
    static __device__ __forceinline__ Frag unit(const Raw& r, int j, int) {
        return q4k_unit(r.q[j / 2], q4k_hdr(r.hdr.x, r.hdr.y, r.hdr.z, r.hdr.w), j);
    }
};

template <> struct StreamW<GGML_TYPE_Q6_K> {  // the device layout (q6k_layout.cuh)
    static constexpr int kSlice = 256, kBytes = 210;
    static constexpr int kDepth = 2;
    struct Raw { uint2 ql[4], qh[4]; uint32_t sc[4], d; };
    static __device__ __forceinline__ void load(Raw& r, const uint8_t* p, int64_t sl, int t) {
        const int pre = q6k_pre(sl);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            r.ql[g] = ldg64(p + pre + 32 * g + 8 * t);
            r.qh[g] = ldg64(p + pre + 128 + 16 * g + 8 * (t & 1));
            r.sc[g] = ldg32(p + q6k_sc(g, pre));
        }
        r.d = __ldg((const unsigned short*)(p + q6k_d(pre)));
    }
    static __device__ __forceinline__ Frag unit(const Raw& r, int j, int t) {
        return q6k_unit(r.ql[j / 2], r.qh[j / 2], r.sc[j / 2], h2f(r.d), j, t);
    }
};

// y (+ bias) = x W^T over the slices [z k_len, ...) of K for weight rows [64 blockIdx.x, ...); with gridDim.z > 1 the partial goes to y + z M N (ldy N).  Rows past N load row N - 1 and
// activation rows past M row M - 1; their outputs are never written.
template <int T, int NT>
__global__ void __launch_bounds__(32 * kWarps) gemm_stream_kernel(const __nv_bfloat16* __restrict__ x, int M, int64_t K,
                                                                  const uint8_t* __restrict__ W, int64_t rb, int64_t N,
                                                                  int64_t k_len, float* __restrict__ y, int64_t ldy,
                                                                  const float* __restrict__ bias) {
    using WT = StreamW<T>;
    constexpr int D = WT::kDepth, kUnits = WT::kSlice / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t r0 = int64_t(blockIdx.x) * kRows + 16 * warp + g;  // this lane's weight rows: r0 and r0 + 8
    const int64_t s_begin = int64_t(blockIdx.z) * k_len / WT::kSlice;
    const int64_t k_end = int64_t(blockIdx.z + 1) * k_len, s_end = (k_end < K ? k_end : K) / WT::kSlice;
    const int64_t steps = s_end - s_begin;
    if (gridDim.z > 1) y += int64_t(blockIdx.z) * M * N;
    const uint8_t* w[2];
#pragma unroll
    for (int i = 0; i < 2; i++) w[i] = W + (r0 + 8 * i < N ? r0 + 8 * i : N - 1) * rb;

    typename WT::Raw ring[D][2];
#pragma unroll
    for (int d = 0; d < D; d++)  // weights are no kernel's output: requested before the wait
        if (d < steps)
#pragma unroll
            for (int i = 0; i < 2; i++) WT::load(ring[d][i], w[i] + (s_begin + d) * WT::kBytes, s_begin + d, t4);
    pdl_start();

    const __nv_bfloat16* xr[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) xr[n] = x + int64_t(8 * n + g < M ? 8 * n + g : M - 1) * K + 8 * t4;
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (int64_t s0 = 0; s0 < steps; s0 += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int64_t s = s0 + d, sl = s_begin + s;
            if (s >= steps) break;
#pragma unroll
            for (int j = 0; j < kUnits; j++) {
                const Frag a = WT::unit(ring[d][0], j, t4), b = WT::unit(ring[d][1], j, t4);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint4 xb = __ldg((const uint4*)(xr[n] + sl * WT::kSlice + 32 * j));
                    mma_bf16(acc[n], a.f[0], b.f[0], a.f[1], b.f[1], xb.x, xb.y);
                    mma_bf16(acc[n], a.f[2], b.f[2], a.f[3], b.f[3], xb.z, xb.w);
                }
            }
            if (s + D < steps)  // the freed slot takes the slice D ahead
#pragma unroll
                for (int i = 0; i < 2; i++) WT::load(ring[d][i], w[i] + (sl + D) * WT::kBytes, sl + D, t4);
        }
    }
    const bool add_bias = bias && gridDim.z == 1;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t row = r0 + 8 * (e / 2);
            const int tok = 8 * n + 2 * t4 + (e % 2);
            if (row < N && tok < M) y[tok * ldy + row] = acc[n][e] + (add_bias ? bias[row] : 0.0f);
        }
}

using Kernel = decltype(&gemm_stream_kernel<GGML_TYPE_Q4_K, 1>);

template <int T> Kernel by_tiles(int nt) {
    switch (nt) {
        case 1: return gemm_stream_kernel<T, 1>;
        default: return gemm_stream_kernel<T, 2>;
    }
}

}  // namespace

bool gemm_stream_fits(uint32_t type, int64_t M, int64_t K) {
    return (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K) && M >= 1 && M <= kGemmStreamMaxRows && K % 256 == 0;
}

int gemm_stream_splits(uint32_t type, int64_t M, int64_t N, int64_t K) {
    // Split K until every SM can hold kResident blocks (each warp is a stream of its own: what counts is bytes in
    // flight, not balanced waves), each range kMinSlices slices or more.  By the weight's shape alone: a row's
    // sums are the same bits whatever the batch.
    constexpr int kResident = 3, kMinSlices = 4, kMaxSplits = 8;
    (void)M;
    if (!gemm_stream_fits(type, 1, K)) return 1;
    const int64_t blocks = (N + kRows - 1) / kRows, slices = K / 256, want = int64_t(kResident) * sm_count();
    int s = 1;
    while (s < kMaxSplits && blocks * s < want && slices / (s + 1) >= kMinSlices) s++;
    return s;
}

void gemm_stream(uint32_t wtype, const void* x, int64_t M, int64_t K, const uint8_t* W, int64_t N, float* y,
                 int64_t ldy, const float* bias, float* partial, cudaStream_t s) {
    if (!gemm_stream_fits(wtype, M, K))
        throw MinferError(strfmt("CUDA gemm_stream: %s weights, %lld rows of width %lld (Q4_K or Q6_K; 1..%d rows; "
                                 "width a multiple of 256)", type_traits(wtype).name, (long long)M, (long long)K,
                                 kGemmStreamMaxRows));
    const int nt = batch_tiles(int(M));
    const int splits = partial ? gemm_stream_splits(wtype, M, N, K) : 1;
    const int64_t k_len = (K / 256 + splits - 1) / splits * 256;  // whole slices a range; the last may be shorter
    const Kernel k = wtype == GGML_TYPE_Q4_K ? by_tiles<GGML_TYPE_Q4_K>(nt) : by_tiles<GGML_TYPE_Q6_K>(nt);
    const dim3 grid(unsigned((N + kRows - 1) / kRows), 1u, unsigned(splits));
    float* out = splits > 1 ? partial : y;
    launch("gemm_stream", k, grid, dim3(32 * kWarps), 0, s, (const __nv_bfloat16*)x, int(M), K, W,
           row_bytes(wtype, K), N, k_len, out, splits > 1 ? N : ldy, bias);
    if (splits > 1) gemm_reduce(partial, splits, M, N, y, ldy, bias, s);
}

}  // namespace minfer::cuda
