// A batch's decode product on the tensor cores' integer path: y[M, N] = x[M, K] W[N, K]^T for 2..64
// activation rows rounded to 8-bit blocks of 32 (Q8Act, decode's matvec_q8 activations) and a quantized W,
// each weight byte read from memory once a step (the shape of llama.cpp's mmq).
//
// A block takes 64 weight rows (16 a warp) and every activation row.  K streams through a ring of shared-memory
// stages, each one slice of K (256 values: a K-quant super-block a row; 128 for Q8_0): the weights' raw bytes,
// the activations' int8 and their block scales, each row one bulk copy by the copy engine counted on the
// stage's mbarrier (a thread a row: issuing 16-byte cp.async pieces cost more instructions than the products).
// For each 32-value unit of the slice a warp decodes its rows' quants to int8 straight from shared memory into
// mma fragments (no dequantized copy anywhere), multiplies them with every activation row by mma.sync
// m16n8k32 (s8 x s8 -> s32; Q6_K's two scales a unit: two m16n8k16), and adds the integer sums, times the
// weight's and x's scales (less the K-quant minimum times x's sum), to f32 accumulators.  The weights of the
// first stages are requested before the kernel waits for the one before it (programmatic dependent launch).
// K is split over blocks (partials summed in order by gemm_reduce) where the weight rows alone leave waves
// half empty.
//
// Reference: float64 numpy over the dequantized weights; tests/test_cuda_matvec.py (the q8 gemm path, with
// the bound of rounding x to 8 bits).
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/matvec_q8_chunks.cuh"
#include "backends/cuda/batch_gemm.cuh"

namespace minfer::cuda {

namespace {

constexpr int kWRows = 64, kQ8Threads = 128;

// c += a (16 x 32, rows) b (32 x 8, columns), signed bytes.  Fragments: a[0] row g, k 4t..4t+3; a[1] row g + 8,
// the same k; a[2], a[3] the same at k + 16; b[0] k 4t.., column g, b[1] k + 16; c[0..1] row g, columns 2t, 2t + 1,
// c[2..3] row g + 8 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same over k 16 (a[0], a[1]; b0).
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// A 32-bit word at a 2-byte aligned shared address (Q8_0's packed 34-byte blocks).
__device__ __forceinline__ uint32_t lds32_a2(const uint8_t* p) {
    const uint32_t* q = (const uint32_t*)(uintptr_t(p) & ~uintptr_t(3));
    return __funnelshift_r(q[0], q[1], uint32_t(uintptr_t(p) & 3) * 8);
}

// One 32-value unit of a weight row, as the mma wants it: the quants of k = 4t..4t+3 (lo) and 16 + 4t.. (hi)
// as signed bytes, and w = a q - b for the unit (Q6_K: w = d sc q with one int8 scale sc_lo / sc_hi per 16).
struct UnitQ {
    uint32_t lo, hi;
    float a, b;
    int sc_lo, sc_hi;
};

// Per weight type: the slice (values), a row-slice's bytes, the stage's row stride (a multiple of 16 that is
// 4 mod 32 words or its negative, so the 8 rows a fragment load touches fall on distinct banks), and the decode of
// unit j of a row whose slice starts at p (p's address mod 16 is the weight's own: the copy keeps it).
template <int T> struct MmaW;

template <> struct MmaW<GGML_TYPE_Q4_K> {
    static constexpr int kSlice = 256, kBytes = 144, kStride = 144, kHalves = 0;
    struct Hdr { float d, dmin; uint32_t s0, s1, s2; };
    static __device__ __forceinline__ Hdr hdr(const uint8_t* p, int64_t) {
        const uint32_t dm = lds32(p);
        return Hdr{h2f(dm), h2f(dm >> 16), lds32(p + 4), lds32(p + 8), lds32(p + 12)};
    }
    static __device__ __forceinline__ UnitQ unit(const uint8_t* p, const Hdr& h, int j, int t) {
        uint32_t scw, mnw;
        k_scale_min_words(h.s0, h.s1, h.s2, j < 4, scw, mnw);
        const int sh = 8 * (j % 4);
        const uint8_t* q = p + 16 + 32 * (j / 2) + 4 * t;
        const int n = 4 * (j % 2);
        return UnitQ{(lds32(q) >> n) & 0x0f0f0f0fu, (lds32(q + 16) >> n) & 0x0f0f0f0fu,
                     h.d * float((scw >> sh) & 0xff), h.dmin * float((mnw >> sh) & 0xff), 0, 0};
    }
};

template <> struct MmaW<GGML_TYPE_Q6_K> {  // the device layout (q6k_layout.cuh)
    static constexpr int kSlice = 256, kBytes = 210, kStride = 240, kHalves = 1;
    struct Hdr { int pre; float d; };
    static __device__ __forceinline__ Hdr hdr(const uint8_t* p, int64_t blk) {
        const int pre = q6k_pre(blk);
        return Hdr{pre, f16_at(p + q6k_d(pre))};
    }
    static __device__ __forceinline__ UnitQ unit(const uint8_t* p, const Hdr& h, int j, int t) {
        const int g = j / 2, n = 4 * (j % 2);
        const uint8_t* ql = p + h.pre + 32 * g + 4 * t;
        const uint32_t qh = lds32(p + h.pre + 128 + 16 * g + 4 * t);
        const uint32_t lo = ((lds32(ql) >> n) & 0x0f0f0f0fu) | (((qh >> n) & 0x03030303u) << 4);
        const uint32_t hi = ((lds32(ql + 16) >> n) & 0x0f0f0f0fu) | (((qh >> (n + 2)) & 0x03030303u) << 4);
        const uint32_t sc = lds32(p + q6k_sc(g, h.pre)) >> (16 * (j % 2));  // this unit's two int8 scales
        return UnitQ{minus32_bytes(lo), minus32_bytes(hi), h.d, 0.0f, int(int8_t(sc & 0xff)), int(int8_t(sc >> 8))};
    }
};

template <> struct MmaW<GGML_TYPE_Q8_0> {
    static constexpr int kSlice = 128, kBytes = 136, kStride = 176, kHalves = 0;
    struct Hdr {};
    static __device__ __forceinline__ Hdr hdr(const uint8_t*, int64_t) { return Hdr{}; }
    static __device__ __forceinline__ UnitQ unit(const uint8_t* p, const Hdr&, int j, int t) {
        const uint8_t* b = p + 34 * j;
        return UnitQ{lds32_a2(b + 2 + 4 * t), lds32_a2(b + 18 + 4 * t), f16_at(b), 0.0f, 0, 0};
    }
};

// A stage: W (64 rows at kStride), x's int8 (8 NT rows at kSlice + 16), x's (d, d sum) per unit (8 NT rows at
// kUnits * 8 + 16: the lanes of a fragment read rows 2t and 2t + 1 on distinct banks).  Few tiles keep four
// stages in flight (a small batch's product is a stream of weight bytes); four or eight tiles two, whose
// multiplies outlast a stage's copy, so that three blocks fit an SM.
template <int T, int NT> struct Stage {
    static constexpr int kSlice = MmaW<T>::kSlice, kUnits = kSlice / 32, kTok = 8 * NT, kCount = NT >= 4 ? 2 : 4;
    static constexpr int kXStride = kSlice + 16, kDStride = kUnits * 8 + 16;
    static constexpr int kW = kWRows * MmaW<T>::kStride, kX = kTok * kXStride, kD = kTok * kDStride;
    static constexpr int kBytes = kW + kX + kD;
};

// y (+ bias) = x W^T over the slices [z k_len, ...) of K; with gridDim.z > 1 the partial goes to y + z M N (ldy N).
// Copies: thread i < 64 brings weight row i's slice (the 16-byte pieces covering it), thread 64 + r activation
// row r's int8 and scales, each one bulk copy a stage counted on the stage's barrier; rows past N or M are not
// copied (their products land in outputs that are never written).
template <int T, int NT>
__global__ void __launch_bounds__(kQ8Threads) gemm_q8_kernel(XQ x, int M, const uint8_t* __restrict__ W, int64_t rb,
                                                             int64_t N, int64_t k_len, float* __restrict__ y,
                                                             int64_t ldy, const float* __restrict__ bias) {
    using S = Stage<T, NT>;
    using WT = MmaW<T>;
    constexpr int kS = S::kCount;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ __align__(8) uint64_t full[kS];
    const int64_t K = x.K, n0 = int64_t(blockIdx.x) * kWRows;
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
        const int64_t sl = s_begin + t;
        uint8_t* st = smem + (t % kS) * S::kBytes;
        expect_bytes(&full[t % kS], unsigned(S::kSlice + S::kUnits * 8));
        bulk_copy_only(st + S::kW + r * S::kXStride, x.q + r * K + sl * S::kSlice, unsigned(S::kSlice), &full[t % kS]);
        bulk_copy_only(st + S::kW + S::kX + r * S::kDStride, x.ds + r * (K / 32) + sl * S::kUnits,
                       unsigned(S::kUnits * 8), &full[t % kS]);
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
        const uint8_t* xs = st + S::kW;
        const uint8_t* xd = st + S::kW + S::kX;  // row r's (d, d sum) of unit j at r kDStride + 8 j
#pragma unroll
        for (int j = 0; j < S::kUnits; j++) {
            const UnitQ u0 = WT::unit(p[0], h[0], j, t4), u1 = WT::unit(p[1], h[1], j, t4);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint8_t* xb = xs + (8 * n + g) * S::kXStride + 32 * j + 4 * t4;
                const uint32_t b0 = lds32(xb), b1 = lds32(xb + 16);
                const float2 d0 = *(const float2*)(xd + (8 * n + 2 * t4) * S::kDStride + 8 * j);
                const float2 d1 = *(const float2*)(xd + (8 * n + 2 * t4 + 1) * S::kDStride + 8 * j);
                int c[4] = {0, 0, 0, 0};
                if constexpr (WT::kHalves) {  // two scales a unit: each half's sums, weighted in integers
                    int e[4] = {0, 0, 0, 0};
                    mma_k16(c, u0.lo, u1.lo, b0);
                    mma_k16(e, u0.hi, u1.hi, b1);
                    c[0] = c[0] * u0.sc_lo + e[0] * u0.sc_hi, c[1] = c[1] * u0.sc_lo + e[1] * u0.sc_hi;
                    c[2] = c[2] * u1.sc_lo + e[2] * u1.sc_hi, c[3] = c[3] * u1.sc_lo + e[3] * u1.sc_hi;
                } else {
                    const uint32_t a[4] = {u0.lo, u1.lo, u0.hi, u1.hi};
                    mma_k32(c, a, b0, b1);
                }
                acc[n][0] += float(c[0]) * (u0.a * d0.x) - u0.b * d0.y;
                acc[n][1] += float(c[1]) * (u0.a * d1.x) - u0.b * d1.y;
                acc[n][2] += float(c[2]) * (u1.a * d0.x) - u1.b * d0.y;
                acc[n][3] += float(c[3]) * (u1.a * d1.x) - u1.b * d1.y;
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

static_assert(MmaW<GGML_TYPE_Q4_K>::kSlice == 256 && MmaW<GGML_TYPE_Q6_K>::kSlice == 256 &&
              MmaW<GGML_TYPE_Q8_0>::kSlice == 128, "the slices batch_slice() gives");

template <int T, int NT> struct Build {
    static constexpr auto kernel = gemm_q8_kernel<T, NT>;
    static constexpr size_t smem = size_t(Stage<T, NT>::kCount) * Stage<T, NT>::kBytes;
};

}  // namespace

bool gemm_q8_fits(uint32_t type, int64_t M, int64_t K) {
    const int sl = batch_slice(type);
    return sl > 0 && M >= 1 && M <= kGemmQ8MaxRows && K % sl == 0;
}

int stream_splits(int64_t blocks, int64_t slices) {
    // Split K where the weight rows' blocks fill four blocks an SM badly (a small batch's product streams bytes:
    // too few blocks leave too few in flight): the first split count (up to 8, each range two slices or more)
    // whose waves are at least 85 % full, else the fullest.  It depends on the weight's shape alone, never on
    // the batch: a row's sums are the same bits whatever else the batch holds.
    const int64_t resident = 4 * int64_t(sm_count());
    int best = 1;
    double best_fill = 0.0;
    for (int s = 1; s <= 8 && slices / s >= 2; s++) {
        const int64_t items = blocks * s, waves = (items + resident - 1) / resident;
        const double fill = double(items) / double(waves * resident);
        if (fill >= 0.85) return s;
        if (fill > best_fill + 1e-9) best = s, best_fill = fill;
    }
    return best;
}

int gemm_q8_splits(uint32_t type, int64_t M, int64_t N, int64_t K) {
    (void)M;
    const int sl = batch_slice(type);
    return sl ? stream_splits((N + kWRows - 1) / kWRows, K / sl) : 1;
}

void gemm_q8(uint32_t wtype, Q8Act x, int64_t M, int64_t K, const uint8_t* W, int64_t N, float* y, int64_t ldy,
             const float* bias, float* partial, cudaStream_t s) {
    if (!gemm_q8_fits(wtype, M, K))
        throw MinferError(strfmt("CUDA gemm_q8: %s weights, %lld rows of width %lld (Q4_K, Q6_K or Q8_0; 1..%d rows; "
                                 "width a multiple of %d)", type_traits(wtype).name, (long long)M, (long long)K,
                                 kGemmQ8MaxRows, std::max(batch_slice(wtype), 128)));
    const int nt = batch_tiles(int(M));
    const int splits = partial ? gemm_q8_splits(wtype, M, N, K) : 1;
    const int sl = batch_slice(wtype);
    const int64_t k_len = (K / sl + splits - 1) / splits * sl;  // whole slices a range; the last may be shorter
    const int64_t rb = row_bytes(wtype, K);
    const auto k = batch_kernel<Build>(wtype, nt, "gemm_q8");
    const dim3 grid(unsigned((N + kWRows - 1) / kWRows), 1u, unsigned(splits));
    float* out = splits > 1 ? partial : y;
    launch("gemm_q8", k.kernel, grid, dim3(kQ8Threads), k.smem, s, XQ{x.q, x.ds, K}, int(M), W, rb, N, k_len, out,
           splits > 1 ? N : ldy, bias);
    if (splits > 1) gemm_reduce(partial, splits, M, N, y, ldy, bias, s);
}

}  // namespace minfer::cuda
