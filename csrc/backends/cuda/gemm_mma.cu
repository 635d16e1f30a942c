// A batch's decode product on the tensor cores: y[M, N] = x[M, K] W[N, K]^T for 2..64 activation rows in bf16
// (mma_act) and a quantized W, each weight byte read from memory once a call.
//
// A block takes 64 weight rows (16 a warp) and every activation row.  K streams through a ring of shared-memory
// stages, each one slice of K (256 values: a K-quant super-block a row; 128 for Q8_0): the weights' raw bytes,
// one 2-D tensor copy (TMA: 64 rows of the slice's 16-byte-aligned span), and the activations' bf16, one bulk
// copy a 128-value chunk (mma_act lays x out chunk-major so that a chunk's rows are contiguous), all
// counted on the stage's mbarrier.  (A bulk copy a row -- 128 a stage -- cost a third of the product's time at
// 64 rows.)  Weights whose rows are not 16-byte multiples (Q8_0 at an odd count of 128-value slices), which no
// tensor map can describe, come a bulk copy a row.  For each 32-value unit of the slice a warp decodes its rows' quants straight from shared memory into
// bf16 mma fragments with their scales applied (mma_weights.cuh; no dequantized copy anywhere; the magic-number
// conversion, no integer-to-float instruction) and multiplies them with every activation row by two mma.sync
// m16n8k16 (bf16 x bf16 -> f32).  The sums need no per-unit scaling: a unit's scales are in the weights, so the tensor cores'
// f32 accumulators carry the whole row (integer products scaled per unit cost more instructions than the
// products themselves).  The weights of the first stages are requested before the kernel waits for the one before
// it (programmatic dependent launch).  K is split over blocks where the weight rows alone leave waves half empty;
// at up to 8 rows the last block of a row range to finish sums the ranges' partials in order (a counter a row
// range: the reduce launch was a tenth of a small batch's step), beyond, one mma_reduce launch for all of the
// launch's weights (one block summing 64 rows x M outputs is the kernel's longest part there), which applies a
// gate/up pair's SwiGLU too.  Up to three weights of one type and width share a launch (q, k and v; gate and
// up), each part a range of the grid's blocks with its own tensor map, output window and partials.
//
// Reference: float64 numpy over the dequantized weights; tests/test_cuda_matvec.py (the mma path, with the
// bound of rounding x and the weights' scaled quants to bf16).
#include <cuda.h>
#include <cudaTypedefs.h>

#include "backends/cuda/batch_gemm.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_act.cuh"
#include "backends/cuda/mma_weights.cuh"

namespace minfer::cuda {

namespace {

constexpr int kWRows = 64, kThreads = 2 * kWRows;  // four warps of 16 weight rows
constexpr int kMaxSplits = 8;                        // K ranges (stream_splits' limit)
constexpr int kSumInKernelRows = 8;                  // at most this many rows: the last block sums the K ranges
constexpr int kChunk = kMmaChunk, kChunkStride = kMmaChunkStride;  // x's chunk (mma_act.cuh)

__device__ __forceinline__ uint2 lds64(const uint8_t* p) { return *(const uint2*)p; }

// Per weight type: the slice (values), a row-slice's bytes, the stage's row stride = the tensor copy's box width
// (32 mod 128 bytes or its negative: the 16 lanes of a 64-bit load phase touch four rows on distinct banks; room
// for the slice at any 16-byte offset), and lane t's fragments of unit j of a row whose slice starts at p.
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

// A stage: W (64 rows at kStride), then x's chunks of the slice, each 8 NT rows at kChunkStride (16-byte loads
// of a phase's two rows on distinct banks).  Few tiles keep four stages in flight (a small batch's product is a
// stream of weight bytes); four or eight tiles two, whose multiplies outlast a stage's copy.  Every stage starts
// on a 128-byte boundary, as the tensor copy needs.
template <int T, int NT> struct Stage {
    static constexpr int kSlice = MmaW<T>::kSlice, kUnits = kSlice / 32, kTok = 8 * NT, kCount = NT >= 4 ? 2 : 4;
    static constexpr int kChunks = kSlice / kChunk, kXChunk = kTok * kChunkStride;
    static constexpr int kW = kWRows * MmaW<T>::kStride, kX = kChunks * kXChunk;
    static constexpr int kBytes = kW + kX;
    static_assert(kW % 128 == 0 && kBytes % 128 == 0, "stages on 128-byte boundaries");
};

// One 2-D tensor copy: the box at (byte c0 of row c1) of the map into dst, counted on bar.
__device__ __forceinline__ void tensor_copy(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
}

// y (+ bias) = x W^T over the slices [z k_len, ...) of K; with gridDim.z > 1 the partial goes to partial + z M N
// (N apart), and where `counters` the block that finds its row range's counter at gridDim.z - 1 sums them into y.
// x is mma_act's layout of M rows.  Thread 0 issues the weights' box (rows past N arrive as zeros) where
// `tensor`, else thread i < 64 weight row i's 16-byte pieces covering the slice (rows past N are not copied), and
// thread 0 x's chunks (M rows; those past M in the stage are never written to y).
// The weights of a launch: part p takes blocks [first[p], first[p + 1]) of the grid's x, with its own tensor map,
// output window and partials (q, k and v, or gate and up, in one launch: one wave's tail instead of three).
struct MmaLaunch {
    CUtensorMap map[kMmaMaxParts];
    MmaPart part[kMmaMaxParts];
    float* partial[kMmaMaxParts];
    int first[kMmaMaxParts + 1];
};

template <int T, int NT>
__global__ void __launch_bounds__(kThreads) gemm_mma_kernel(const __nv_bfloat16* __restrict__ x, int M, int64_t K,
                                                            const __grid_constant__ MmaLaunch L, bool tensor,
                                                            int64_t rb, int64_t k_len, int* counters) {
    using S = Stage<T, NT>;
    using WT = MmaW<T>;
    constexpr int kS = S::kCount;
    extern __shared__ __align__(1024) uint8_t smem[];
    uint64_t* full = (uint64_t*)(smem + kS * S::kBytes);
    // this block's part (its fields read at fixed offsets of the parameters, then selected)
    const int bx = int(blockIdx.x), p = bx >= L.first[2] ? 2 : bx >= L.first[1] ? 1 : 0;
    const MmaPart P = p == 2 ? L.part[2] : p == 1 ? L.part[1] : L.part[0];
    const CUtensorMap* wmap = p == 2 ? &L.map[2] : p == 1 ? &L.map[1] : &L.map[0];
    float* const partial = p == 2 ? L.partial[2] : p == 1 ? L.partial[1] : L.partial[0];
    const uint8_t* __restrict__ W = P.W;
    const int64_t N = P.N, ldy = P.ldy;
    float* __restrict__ y = P.y;
    const float* __restrict__ bias = P.bias;
    const int64_t n0 = int64_t(bx - L.first[p]) * kWRows;
    const int64_t s_begin = int64_t(blockIdx.z) * k_len / S::kSlice;
    const int64_t k_end = int64_t(blockIdx.z + 1) * k_len, s_end = (k_end < K ? k_end : K) / S::kSlice;
    const int64_t steps = s_end - s_begin;
    const bool split = gridDim.z > 1;
    const int tid = threadIdx.x, w_rows = int(N - n0 < kWRows ? N - n0 : kWRows);
    const bool issuer = tid == 0, row_issuer = !tensor && tid < w_rows;
    if (issuer) {
        for (int i = 0; i < kS; i++) init_stage_barrier(&full[i], tensor ? 1u : 1u + unsigned(w_rows));
        fence_barrier_init();
    }
    __syncthreads();

    const unsigned x_bytes = unsigned(M) * kChunkStride;  // a chunk's rows, contiguous
    const uint8_t* w_row = W + (n0 + (row_issuer ? tid : 0)) * rb;
    auto issue_w = [&](int64_t t) {  // the stage's arrivals, expecting all of its bytes, and its weights
        uint64_t* bar = &full[t % kS];
        const int64_t at = (s_begin + t) * WT::kBytes;
        if (issuer) expect_bytes(bar, (tensor ? unsigned(S::kW) : 0u) + S::kChunks * x_bytes);
        if (tensor && issuer) tensor_copy(smem + (t % kS) * S::kBytes, wmap, int(at & ~int64_t(15)), int(n0), bar);
        if (row_issuer) {
            const uintptr_t g = uintptr_t(w_row + at), a = g & ~uintptr_t(15);
            bulk_copy(smem + (t % kS) * S::kBytes + tid * WT::kStride, (const void*)a,
                      unsigned((g + WT::kBytes + 15) / 16 * 16 - a), bar);
        }
    };
    auto issue_x = [&](int64_t t) {
        const int64_t c0 = (s_begin + t) * S::kChunks;
#pragma unroll
        for (int c = 0; c < S::kChunks; c++)
            bulk_copy_only(smem + (t % kS) * S::kBytes + S::kW + c * S::kXChunk,
                           (const uint8_t*)x + (c0 + c) * M * kChunkStride, x_bytes, &full[t % kS]);
    };
    // the weights of every stage before the wait for the kernel before (they are no kernel's output)
    if (issuer || row_issuer)
        for (int t = 0; t < kS && t < steps; t++) issue_w(t);
    pdl_start();
    if (issuer)
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
        for (int i = 0; i < 2; i++) {  // a row's copy starts at the 16-byte boundary below its slice
            const int64_t row = n0 + r0 + 8 * i < N ? n0 + r0 + 8 * i : N - 1;
            p[i] = st + (r0 + 8 * i) * WT::kStride + int(uintptr_t(W + row * rb + sl * WT::kBytes) & 15);
            h[i] = WT::hdr(p[i], sl);
        }
        const uint8_t* xs = st + S::kW + g * kChunkStride + 16 * t4;
#pragma unroll
        for (int j = 0; j < S::kUnits; j++) {
            const Frag a = WT::unit(p[0], h[0], j, t4), b = WT::unit(p[1], h[1], j, t4);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint4 xb =
                    *(const uint4*)(xs + (j / 4) * S::kXChunk + 8 * n * kChunkStride + 64 * (j % 4));
                mma_bf16(acc[n], a.f[0], b.f[0], a.f[1], b.f[1], xb.x, xb.y);
                mma_bf16(acc[n], a.f[2], b.f[2], a.f[3], b.f[3], xb.z, xb.w);
            }
        }
        __syncthreads();  // every warp is done with the stage: it is refilled with slice t + kS
        if (t + kS < steps) {
            if (issuer || row_issuer) issue_w(t + kS);
            if (issuer) issue_x(t + kS);
        }
    }
    float* out = split ? partial + int64_t(blockIdx.z) * M * N : y;
    const int64_t ldo = split ? N : ldy;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t row = n0 + r0 + 8 * (e / 2);
            const int tok = 8 * n + 2 * t4 + (e % 2);
            if (row < N && tok < M) out[tok * ldo + row] = acc[n][e] + (bias && !split ? bias[row] : 0.0f);
        }
    if (!split || !counters) return;
    // The row range's last block to finish: bias, then the ranges in order (the sums gemm_reduce made).
    __shared__ bool last;
    __threadfence();  // this block's partial is visible before its count
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counters[blockIdx.x], 1) == int(gridDim.z) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Four rows a thread (float4 where N allows) and every range's loads in flight before the first add: one
    // block sums M x 64 outputs, and a load at a time (one L2 round trip each) made it the kernel's longest part.
    const int ranges = int(gridDim.z);
    const bool vec = N % 4 == 0;
    for (int i = tid; i < M * (kWRows / 4); i += kThreads) {
        const int tok = i / (kWRows / 4);
        const int64_t row = n0 + 4 * (i % (kWRows / 4));
        if (row >= N) continue;
        float4 v[kMaxSplits];
#pragma unroll
        for (int z = 0; z < kMaxSplits; z++) {
            if (z >= ranges) break;
            const float* p = partial + (int64_t(z) * M + tok) * N + row;
            v[z] = vec ? __ldcg((const float4*)p)
                       : make_float4(__ldcg(p), row + 1 < N ? __ldcg(p + 1) : 0.0f, row + 2 < N ? __ldcg(p + 2) : 0.0f,
                                     row + 3 < N ? __ldcg(p + 3) : 0.0f);
        }
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (bias && row + c < N) sum[c] = bias[row + c];
#pragma unroll
        for (int z = 0; z < kMaxSplits; z++) {
            if (z >= ranges) break;
            sum[0] += v[z].x, sum[1] += v[z].y, sum[2] += v[z].z, sum[3] += v[z].w;
        }
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (row + c < N) y[tok * ldy + row + c] = sum[c];
    }
    if (tid == 0) counters[blockIdx.x] = 0;  // ready for the next launch, which waits for this one
}

// The K ranges of a launch's parts summed in order after bias (gemm_reduce's sums), every part in one launch:
// element i of the launch's outputs (part by part, row by row) a thread.  A GLU pair (glu: 1 silu, 2 gelu;
// parts gate and up of one width) writes act(gate) x up into the gate's output instead, and with xb.p also in
// gemm_mma's layout (the down projection's input): the elementwise launch after it goes too.
struct MmaSums {
    MmaPart part[kMmaMaxParts];
    float* partial[kMmaMaxParts];
};

__global__ void mma_reduce_kernel(const __grid_constant__ MmaSums L, int splits, int M, int64_t total, int glu,
                                  MmaAct xb) {
    pdl_start();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    auto sum = [&](int p, int64_t e) {  // element e of part p
        const MmaPart& P = L.part[p];
        float v = P.bias ? P.bias[e % P.N] : 0.0f;
        for (int z = 0; z < splits; z++) v += __ldcg(L.partial[p] + int64_t(z) * M * P.N + e);
        return v;
    };
    if (glu) {
        const MmaPart& P = L.part[0];
        const float g = sum(0, i), u = sum(1, i), v = (glu == 1 ? silu(g) : gelu(g)) * u;
        const int64_t r = i / P.N, c = i % P.N;
        P.y[r * P.ldy + c] = v;
        if (xb.p) mma_act_store((__nv_bfloat16*)xb.p, xb.rows, int(r), c, v);
        return;
    }
    int p = 0;
    int64_t e = i;
    while (p + 1 < kMmaMaxParts && L.part[p + 1].N && e >= int64_t(M) * L.part[p].N) e -= int64_t(M) * L.part[p++].N;
    const MmaPart& P = L.part[p];
    P.y[(e / P.N) * P.ldy + e % P.N] = sum(p, e);
}

// x [rows, K] (ldx apart) -> the bf16 layout of mma_act.cuh, 8 values a thread.
__global__ void mma_act_kernel(const float* __restrict__ x, int64_t ldx, int64_t K, __nv_bfloat16* __restrict__ out) {
    pdl_start();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int r = blockIdx.y;
    if (8 * i >= K) return;
    mma_act_store4(out, gridDim.y, r, 8 * i, *(const float4*)(x + r * ldx + 8 * i));
    mma_act_store4(out, gridDim.y, r, 8 * i + 4, *(const float4*)(x + r * ldx + 8 * i + 4));
}

static_assert(MmaW<GGML_TYPE_Q4_K>::kSlice == 256 && MmaW<GGML_TYPE_Q6_K>::kSlice == 256 &&
              MmaW<GGML_TYPE_Q8_0>::kSlice == 128, "the slices batch_slice() gives");

template <int T, int NT> struct Build {
    static constexpr auto kernel = gemm_mma_kernel<T, NT>;
    static constexpr size_t smem = size_t(Stage<T, NT>::kCount) * (Stage<T, NT>::kBytes + 8);  // + the barriers
};

}  // namespace

bool gemm_mma_fits(uint32_t type, int64_t M, int64_t K) {
    const int sl = batch_slice(type);
    return sl > 0 && M >= 1 && M <= kGemmMmaMaxRows && K % sl == 0;
}

int gemm_mma_splits(uint32_t type, int64_t M, const MmaPart* parts, int n, int64_t K) {
    (void)M;
    const int sl = batch_slice(type);
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) blocks += (parts[i].N + kWRows - 1) / kWRows;
    return sl ? stream_splits(blocks, K / sl) : 1;
}

size_t gemm_mma_partial_floats(uint32_t type, int64_t M, const MmaPart* parts, int n, int64_t K) {
    const int splits = gemm_mma_splits(type, M, parts, n, K);
    size_t floats = 0;
    for (int i = 0; i < n; i++) floats += (size_t(splits) * size_t(M) * size_t(parts[i].N) + 3) / 4 * 4;
    return splits > 1 ? floats : 0;
}

int gemm_mma_splits(uint32_t type, int64_t M, int64_t N, int64_t K) {
    const MmaPart one{nullptr, N};
    return gemm_mma_splits(type, M, &one, 1, K);
}

size_t mma_act_bytes(int rows, int64_t K) { return size_t(rows) * size_t((K + kChunk - 1) / kChunk) * kChunkStride; }

void check_mma_act(const char* kernel, MmaAct xb, int rows, int64_t cols) {
    if (xb.p && (xb.rows != rows || rows > kGemmMmaMaxRows || cols % kChunk))
        throw MinferError(strfmt("CUDA %s: gemm_mma's layout of %d rows for %d rows of %lld (at most %d rows, a "
                                 "multiple of %d)", kernel, xb.rows, rows, (long long)cols, kGemmMmaMaxRows, kChunk));
}

void mma_act(const float* x, int64_t ldx, int rows, int64_t K, void* out, cudaStream_t s) {
    if (K % kChunk || ldx % 4)
        throw MinferError(strfmt("CUDA mma_act: width %lld (a multiple of %d), stride %lld (of 4)", (long long)K,
                                 kChunk, (long long)ldx));
    launch("mma_act", mma_act_kernel, dim3(unsigned((K / 8 + 127) / 128), unsigned(rows)), dim3(128), 0, s, x, ldx, K,
           (__nv_bfloat16*)out);
}

// W's rows as a 2-D tensor of bytes whose box is one stage: a row-slice's 16-byte-aligned span, 64 rows (W
// 16-byte aligned, rows 16-byte multiples).
static CUtensorMap weight_map(uint32_t type, const uint8_t* W, int64_t rb, int64_t N, int box) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                               &found);
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn)
            throw MinferError("CUDA gemm_mma: the driver has no cuTensorMapEncodeTiled (CUDA 12 or newer needed)");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    CUtensorMap map;
    const cuuint64_t dims[2] = {cuuint64_t(rb), cuuint64_t(N)}, strides[1] = {cuuint64_t(rb)};
    const cuuint32_t boxes[2] = {cuuint32_t(box), cuuint32_t(kWRows)}, steps[2] = {1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(W), dims, strides, boxes,
                              steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw MinferError(strfmt("CUDA gemm_mma: no tensor map for %lld x %lld bytes of %s weights (error %d)",
                                 (long long)N, (long long)rb, type_traits(type).name, int(r)));
    return map;
}

bool gemm_mma(uint32_t wtype, const void* x, int64_t M, int64_t K, const MmaPart* parts, int n, float* partial,
              int* counters, cudaStream_t s, int glu, MmaAct xb) {
    if (!gemm_mma_fits(wtype, M, K))
        throw MinferError(strfmt("CUDA gemm_mma: %s weights, %lld rows of width %lld (Q4_K, Q6_K or Q8_0; 1..%d rows; "
                                 "width a multiple of %d)", type_traits(wtype).name, (long long)M, (long long)K,
                                 kGemmMmaMaxRows, std::max(batch_slice(wtype), 128)));
    if (n < 1 || n > kMmaMaxParts) throw MinferError(strfmt("CUDA gemm_mma: %d weights in one launch (1..%d)", n, kMmaMaxParts));
    const int nt = batch_tiles(int(M));
    const int splits = partial ? gemm_mma_splits(wtype, M, parts, n, K) : 1;
    const int sl = batch_slice(wtype);
    const int64_t k_len = (K / sl + splits - 1) / splits * sl;  // whole slices a range; the last may be shorter
    const int64_t rb = row_bytes(wtype, K);
    const int box = wtype == GGML_TYPE_Q4_K ? MmaW<GGML_TYPE_Q4_K>::kStride
                    : wtype == GGML_TYPE_Q6_K ? MmaW<GGML_TYPE_Q6_K>::kStride : MmaW<GGML_TYPE_Q8_0>::kStride;
    bool tensor = rb % 16 == 0;
    for (int i = 0; i < n; i++) tensor = tensor && uintptr_t(parts[i].W) % 16 == 0;
    MmaLaunch L{};
    int64_t blocks = 0;
    float* part_partial = partial;
    for (int i = 0; i < n; i++) {
        L.part[i] = parts[i];
        if (tensor) L.map[i] = weight_map(wtype, parts[i].W, rb, parts[i].N, box);
        L.partial[i] = splits > 1 ? part_partial : nullptr;
        if (splits > 1) part_partial += (int64_t(splits) * M * parts[i].N + 3) / 4 * 4;  // 16-byte aligned (float4s)
        L.first[i] = int(blocks);
        blocks += (parts[i].N + kWRows - 1) / kWRows;
    }
    for (int i = n; i <= kMmaMaxParts; i++) L.first[i] = int(blocks);
    const auto k = batch_kernel<Build>(wtype, nt, "gemm_mma");
    const dim3 grid(unsigned(blocks), 1u, unsigned(splits));
    const bool sum_in_kernel = splits > 1 && M <= kSumInKernelRows;
    if (splits > kMaxSplits || (sum_in_kernel && (!counters || grid.x > unsigned(kGemmMmaCounters))))
        throw MinferError(strfmt("CUDA gemm_mma: %u blocks of weight rows split over K %d times (at most %d counters, "
                                 "%d ranges)", grid.x, splits, kGemmMmaCounters, kMaxSplits));
    if (glu && (n != 2 || parts[0].N != parts[1].N))
        throw MinferError(strfmt("CUDA gemm_mma: a GLU pair is two weights of one height (%d given)", n));
    if (glu) check_mma_act("gemm_mma", xb, int(M), parts[0].N);
    launch("gemm_mma", k.kernel, grid, dim3(kThreads), k.smem, s, (const __nv_bfloat16*)x, int(M), K, L, tensor, rb,
           k_len, sum_in_kernel ? counters : nullptr);
    if (splits == 1 || sum_in_kernel) return false;
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += M * parts[i].N;
    if (glu) total = M * parts[0].N;
    MmaSums sums{};
    for (int i = 0; i < n; i++) sums.part[i] = parts[i], sums.partial[i] = L.partial[i];
    launch("mma_reduce", mma_reduce_kernel, dim3(unsigned((total + 255) / 256)), dim3(256), 0, s, sums, splits, int(M),
           total, glu, xb);
    return glu != 0;
}

void gemm_mma(uint32_t wtype, const void* x, int64_t M, int64_t K, const uint8_t* W, int64_t N, float* y, int64_t ldy,
              const float* bias, float* partial, int* counters, cudaStream_t s) {
    const MmaPart one{W, N, y, ldy, bias};
    gemm_mma(wtype, x, M, K, &one, 1, partial, counters, s);
}

}  // namespace minfer::cuda
