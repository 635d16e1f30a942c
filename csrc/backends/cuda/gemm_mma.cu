// A batch's decode product on the tensor cores: y[M, N] = x[M, K] W[N, K]^T for 2..64 activation rows in bf16
// (mma_act) and a quantized W, each weight byte read from memory once a call.
//
// A block takes 64 weight rows (16 a warp) and every activation row.  K streams through a ring of shared-memory
// stages, each one slice of K (256 values: a K-quant super-block a row; 128 for Q8_0): the weights' raw bytes and
// the activations' bf16, each row one bulk copy by the copy engine counted on the stage's mbarrier (a thread a
// row).  For each 32-value unit of the slice a warp decodes its rows' quants straight from shared memory into
// bf16 mma fragments with their scales applied (mma_weights.cuh; no dequantized copy anywhere; the magic-number
// conversion, no integer-to-float instruction) and multiplies them with every activation row by two mma.sync
// m16n8k16 (bf16 x bf16 -> f32).  The sums need no per-unit scaling: a unit's scales are in the weights, so the tensor cores'
// f32 accumulators carry the whole row (integer products scaled per unit cost more instructions than the
// products themselves).  The weights of the first stages are requested before the kernel waits for the one before
// it (programmatic dependent launch).  K is split over blocks (partials summed in order by gemm_reduce) where the
// weight rows alone leave waves half empty.
//
// Reference: float64 numpy over the dequantized weights; tests/test_cuda_matvec.py (the mma path, with the
// bound of rounding x and the weights' scaled quants to bf16).
#include "backends/cuda/batch_gemm.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_weights.cuh"

namespace minfer::cuda {

namespace {

constexpr int kWRows = 64, kThreads = 2 * kWRows;  // a thread a weight row and one an activation row copy

__device__ __forceinline__ uint2 lds64(const uint8_t* p) { return *(const uint2*)p; }

// Per weight type: the slice (values), a row-slice's bytes, the stage's row stride (32 mod 128 bytes or its
// negative: the 16 lanes of a 64-bit load phase touch four rows on distinct banks; room for the slice at any
// 16-byte offset the copy keeps), and lane t's fragments of unit j of a row whose slice starts at p.
template <int T> struct MmaW;

template <> struct MmaW<GGML_TYPE_Q4_K> {
    static constexpr int kSlice = 256, kBytes = 144, kStride = 160;
    using Hdr = Q4kHdr;
    static __device__ __forceinline__ Hdr hdr(const uint8_t* p, int64_t) {
        return q4k_hdr(lds32(p), lds32(p + 4), lds32(p + 8), lds32(p + 12));
    }
    static __device__ __forceinline__ Frag unit(const uint8_t* p, const Hdr& h, int j, int t) {
        return q4k_unit(lds64(p + 16 + 32 * (j / 2) + 8 * t), h, j);
    }
};

template <> struct MmaW<GGML_TYPE_Q6_K> {  // the device layout (q6k_layout.cuh)
    static constexpr int kSlice = 256, kBytes = 210, kStride = 224;
    struct Hdr { int pre; float d; };
    static __device__ __forceinline__ Hdr hdr(const uint8_t* p, int64_t blk) {
        const int pre = q6k_pre(blk);
        return Hdr{pre, f16_at(p + q6k_d(pre))};
    }
    static __device__ __forceinline__ Frag unit(const uint8_t* p, const Hdr& h, int j, int t) {
        const int g = j / 2;
        return q6k_unit(lds64(p + h.pre + 32 * g + 8 * t), lds64(p + h.pre + 128 + 16 * g + 8 * (t & 1)),
                        lds32(p + q6k_sc(g, h.pre)), h.d, j, t);
    }
};

template <> struct MmaW<GGML_TYPE_Q8_0> {
    static constexpr int kSlice = 128, kBytes = 136, kStride = 160;
    struct Hdr {};
    static __device__ __forceinline__ Hdr hdr(const uint8_t*, int64_t) { return Hdr{}; }
    // Signed bytes through f32 (2^23 + 128 + q, exact), scaled there, then rounded to bf16 once.
    static __device__ __forceinline__ Frag unit(const uint8_t* p, const Hdr&, int j, int t) {
        const uint8_t* b = p + 34 * j;
        const float d = f16_at(b);
        const uint32_t* w = (const uint32_t*)(uintptr_t(b + 2 + 8 * t) & ~uintptr_t(3));
        const uint32_t sh = uint32_t(uintptr_t(b + 2 + 8 * t) & 3) * 8, w0 = w[0], w1 = w[1], w2 = w[2];
        const uint32_t q[2] = {__funnelshift_r(w0, w1, sh) ^ 0x80808080u, __funnelshift_r(w1, w2, sh) ^ 0x80808080u};
        Frag r;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[e] = (__uint_as_float(__byte_perm(q[i], 0x4b000000u, 0x7540u | uint32_t(e))) - 8388736.0f) * d;
            r.f[2 * i] = as_u32(__floats2bfloat162_rn(v[0], v[2]));
            r.f[2 * i + 1] = as_u32(__floats2bfloat162_rn(v[1], v[3]));
        }
        return r;
    }
};

// A stage: W (64 rows at kStride), x's bf16 (8 NT rows at 2 kSlice + 64 bytes: 16-byte loads of a phase's two
// rows on distinct banks).  Few tiles keep four stages in flight (a small batch's product is a stream of weight
// bytes); four or eight tiles two, whose multiplies outlast a stage's copy.
template <int T, int NT> struct Stage {
    static constexpr int kSlice = MmaW<T>::kSlice, kUnits = kSlice / 32, kTok = 8 * NT, kCount = NT >= 4 ? 2 : 4;
    static constexpr int kXStride = 2 * kSlice + 64;
    static constexpr int kW = kWRows * MmaW<T>::kStride, kX = kTok * kXStride;
    static constexpr int kBytes = kW + kX;
};

// y (+ bias) = x W^T over the slices [z k_len, ...) of K; with gridDim.z > 1 the partial goes to y + z M N (ldy N).
// Copies: thread i < 64 brings weight row i's slice (the 16-byte pieces covering it), thread 64 + r activation
// row r's, each one bulk copy a stage counted on the stage's barrier; rows past N or M are not copied (their
// products land in outputs that are never written).
template <int T, int NT>
__global__ void __launch_bounds__(kThreads) gemm_mma_kernel(const __nv_bfloat16* __restrict__ x, int M, int64_t K,
                                                            const uint8_t* __restrict__ W, int64_t rb, int64_t N,
                                                            int64_t k_len, float* __restrict__ y, int64_t ldy,
                                                            const float* __restrict__ bias) {
    using S = Stage<T, NT>;
    using WT = MmaW<T>;
    constexpr int kS = S::kCount;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ __align__(8) uint64_t full[kS];
    const int64_t n0 = int64_t(blockIdx.x) * kWRows;
    const int64_t s_begin = int64_t(blockIdx.z) * k_len / S::kSlice;
    const int64_t k_end = int64_t(blockIdx.z + 1) * k_len, s_end = (k_end < K ? k_end : K) / S::kSlice;
    const int64_t steps = s_end - s_begin;
    if (gridDim.z > 1) y += int64_t(blockIdx.z) * M * N;
    const int w_rows = int(N - n0 < kWRows ? N - n0 : kWRows), x_rows = M < S::kTok ? M : S::kTok;
    if (threadIdx.x == 0) {
        for (int i = 0; i < kS; i++) init_stage_barrier(&full[i], unsigned(w_rows + x_rows));
        fence_barrier_init();
    }
    __syncthreads();

    const int tid = threadIdx.x;
    const bool w_issuer = tid < w_rows, x_issuer = tid >= kWRows && tid - kWRows < x_rows;
    const uint8_t* w_row = W + (n0 + (w_issuer ? tid : 0)) * rb;
    auto issue_w = [&](int64_t t) {
        const uintptr_t g = uintptr_t(w_row + (s_begin + t) * WT::kBytes), a = g & ~uintptr_t(15);
        bulk_copy(smem + (t % kS) * S::kBytes + tid * WT::kStride, (const void*)a,
                  unsigned((g + WT::kBytes + 15) / 16 * 16 - a), &full[t % kS]);
    };
    auto issue_x = [&](int64_t t) {
        const int r = tid - kWRows;
        bulk_copy(smem + (t % kS) * S::kBytes + S::kW + r * S::kXStride, x + r * K + (s_begin + t) * S::kSlice,
                  unsigned(2 * S::kSlice), &full[t % kS]);
    };
    // the weights of every stage before the wait for the kernel before (they are no kernel's output)
    if (w_issuer)
        for (int t = 0; t < kS && t < steps; t++) issue_w(t);
    pdl_start();
    if (x_issuer)
        for (int t = 0; t < kS && t < steps; t++) issue_x(t);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int r0 = warp * 16 + g;  // this lane's weight rows: r0 and r0 + 8
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (int64_t t = 0; t < steps; t++) {
        wait_phase(&full[t % kS], unsigned(t / kS) & 1u);  // slice t has landed
        const uint8_t* st = smem + (t % kS) * S::kBytes;
        const int64_t sl = s_begin + t;
        const uint8_t* p[2];
        typename WT::Hdr h[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = r0 + 8 * i;
            const int64_t row = n0 + r < N ? n0 + r : N - 1;
            p[i] = st + r * WT::kStride + int((uintptr_t(W + row * rb + sl * WT::kBytes)) & 15);
            h[i] = WT::hdr(p[i], sl);
        }
        const uint8_t* xs = st + S::kW + g * S::kXStride + 16 * t4;
#pragma unroll
        for (int j = 0; j < S::kUnits; j++) {
            const Frag a = WT::unit(p[0], h[0], j, t4), b = WT::unit(p[1], h[1], j, t4);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint4 xb = *(const uint4*)(xs + 8 * n * S::kXStride + 64 * j);
                mma_bf16(acc[n], a.f[0], b.f[0], a.f[1], b.f[1], xb.x, xb.y);
                mma_bf16(acc[n], a.f[2], b.f[2], a.f[3], b.f[3], xb.z, xb.w);
            }
        }
        __syncthreads();  // every warp is done with the stage: it is refilled with slice t + kS
        if (t + kS < steps) {
            if (w_issuer) issue_w(t + kS);
            if (x_issuer) issue_x(t + kS);
        }
    }
    const bool add_bias = bias && gridDim.z == 1;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t row = n0 + r0 + 8 * (e / 2);
            const int tok = 8 * n + 2 * t4 + (e % 2);
            if (row < N && tok < M) y[tok * ldy + row] = acc[n][e] + (add_bias ? bias[row] : 0.0f);
        }
}

// x [rows, K] (ldx apart) -> bf16 [rows, K], each 8 values in the mma's order (0 2 1 3 4 6 5 7).
__global__ void mma_act_kernel(const float* __restrict__ x, int64_t ldx, int64_t K, __nv_bfloat16* __restrict__ out) {
    pdl_start();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (8 * i >= K) return;
    const float4 a = *(const float4*)(x + r * ldx + 8 * i), b = *(const float4*)(x + r * ldx + 8 * i + 4);
    uint4 o;
    o.x = as_u32(__floats2bfloat162_rn(a.x, a.z));
    o.y = as_u32(__floats2bfloat162_rn(a.y, a.w));
    o.z = as_u32(__floats2bfloat162_rn(b.x, b.z));
    o.w = as_u32(__floats2bfloat162_rn(b.y, b.w));
    *(uint4*)(out + r * K + 8 * i) = o;
}

static_assert(MmaW<GGML_TYPE_Q4_K>::kSlice == 256 && MmaW<GGML_TYPE_Q6_K>::kSlice == 256 &&
              MmaW<GGML_TYPE_Q8_0>::kSlice == 128, "the slices batch_slice() gives");

template <int T, int NT> struct Build {
    static constexpr auto kernel = gemm_mma_kernel<T, NT>;
    static constexpr size_t smem = size_t(Stage<T, NT>::kCount) * Stage<T, NT>::kBytes;
};

}  // namespace

bool gemm_mma_fits(uint32_t type, int64_t M, int64_t K) {
    const int sl = batch_slice(type);
    return sl > 0 && M >= 1 && M <= kGemmMmaMaxRows && K % sl == 0;
}

int gemm_mma_splits(uint32_t type, int64_t M, int64_t N, int64_t K) {
    (void)M;
    const int sl = batch_slice(type);
    return sl ? stream_splits((N + kWRows - 1) / kWRows, K / sl) : 1;
}

size_t mma_act_bytes(int rows, int64_t K) { return size_t(rows) * size_t(K) * 2; }

void mma_act(const float* x, int64_t ldx, int rows, int64_t K, void* out, cudaStream_t s) {
    if (K % 8 || ldx % 4)
        throw MinferError(strfmt("CUDA mma_act: width %lld (a multiple of 8), stride %lld (of 4)", (long long)K,
                                 (long long)ldx));
    launch("mma_act", mma_act_kernel, dim3(unsigned((K / 8 + 127) / 128), unsigned(rows)), dim3(128), 0, s, x, ldx, K,
           (__nv_bfloat16*)out);
}

void gemm_mma(uint32_t wtype, const void* x, int64_t M, int64_t K, const uint8_t* W, int64_t N, float* y, int64_t ldy,
              const float* bias, float* partial, cudaStream_t s) {
    if (!gemm_mma_fits(wtype, M, K))
        throw MinferError(strfmt("CUDA gemm_mma: %s weights, %lld rows of width %lld (Q4_K, Q6_K or Q8_0; 1..%d rows; "
                                 "width a multiple of %d)", type_traits(wtype).name, (long long)M, (long long)K,
                                 kGemmMmaMaxRows, std::max(batch_slice(wtype), 128)));
    const int nt = batch_tiles(int(M));
    const int splits = partial ? gemm_mma_splits(wtype, M, N, K) : 1;
    const int sl = batch_slice(wtype);
    const int64_t k_len = (K / sl + splits - 1) / splits * sl;  // whole slices a range; the last may be shorter
    const int64_t rb = row_bytes(wtype, K);
    const auto k = batch_kernel<Build>(wtype, nt, "gemm_mma");
    const dim3 grid(unsigned((N + kWRows - 1) / kWRows), 1u, unsigned(splits));
    float* out = splits > 1 ? partial : y;
    launch("gemm_mma", k.kernel, grid, dim3(kThreads), k.smem, s, (const __nv_bfloat16*)x, int(M), K, W, rb, N, k_len,
           out, splits > 1 ? N : ldy, bias);
    if (splits > 1) gemm_reduce(partial, splits, M, N, y, ldy, bias, s);
}

}  // namespace minfer::cuda
