// Causal GQA attention over the KV cache, flash-style: each block owns one
// (query head, row) and walks the row's visible positions in chunks of 128
// with an online softmax (running max, running sum, rescaled output).
//
// Decode (one row) splits the KV length over gridDim.z blocks whose partials
// a combine kernel merges (flash decoding); the split count depends only on
// n_ctx, so a captured decode graph stays valid as the cache fills: blocks
// whose chunks lie past the row's position write an empty partial.  Over an
// f16 cache the splits of a head can instead be one thread-block cluster that
// merges them in distributed shared memory (attention_decode_f16_cl; the rule
// is cluster_merge_splits).  Prefill rows use one block each (there are rows x
// heads blocks already).
//
// Prefill over an f16 cache (the default) runs on the tensor cores instead:
// a block takes 64 query rows of one head and walks the visible positions in
// tiles of 64 -- S = Q K^T (WMMA, f16 in, f32 out), masked online softmax per
// row in f32, O += P V (P rounded to f16) with O kept in shared memory so it
// can be rescaled row by row.
//
// Positions are read on the device, never from the host: the same launch
// serves every step.
#include <mma.h>

#include "backends/cuda/common.cuh"
#include "backends/kernel_choice.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/matvec_rows.cuh"
#include "quant/types.h"

namespace minfer::cuda {

namespace {

constexpr int kChunk = 128, kThreads = 128, kMaxHeadDim = 256;
constexpr int kClusterSplits = 8;  // blocks a cluster of the decode merge (the portable cluster size)

__device__ __forceinline__ float kv_at(uint32_t kv_type, const uint8_t* base, int64_t j, int dim, int col) {
    if (kv_type == GGML_TYPE_F16) return __half2float(((const __half*)base)[j * dim + col]);
    if (kv_type == GGML_TYPE_F32) return ((const float*)base)[j * dim + col];
    const uint8_t* blk = base + j * int64_t(dim / 32) * 34 + (col / 32) * 34;  // q8_0
    return f16_at(blk) * float(((const int8_t*)blk)[2 + col % 32]);
}

// Values col..col+7 of cache row j (col a multiple of 8): one 16-byte load for f16.
__device__ __forceinline__ void kv_load8(uint32_t kv_type, const uint8_t* base, int64_t j, int dim, int col, float* y) {
    if (kv_type == GGML_TYPE_F16) {
        const uint4 v = *(const uint4*)((const __half*)base + j * dim + col);
        const __half2* h = (const __half2*)&v;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(h[i]);
            y[2 * i] = f.x;
            y[2 * i + 1] = f.y;
        }
    } else if (kv_type == GGML_TYPE_F32) {
        const float4* p = (const float4*)((const float*)base + j * dim + col);
        const float4 u = p[0], v = p[1];
        y[0] = u.x, y[1] = u.y, y[2] = u.z, y[3] = u.w, y[4] = v.x, y[5] = v.y, y[6] = v.z, y[7] = v.w;
    } else {
        const uint8_t* blk = base + j * int64_t(dim / 32) * 34 + (col / 32) * 34;
        const float d = f16_at(blk);
        const int8_t* q = (const int8_t*)blk + 2 + col % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = d * float(q[i]);
    }
}

// Per chunk of 128 positions: each thread scores one position (its K row read
// in 16-byte pieces, all in flight at once); after the block's max and sum,
// each warp accumulates P V over 32 positions with lanes across head dims,
// and the four warps' sums meet in shared memory.
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnShape a, const float* __restrict__ q, int64_t ldq,
                                                             const int32_t* __restrict__ pos,
                                                             const uint8_t* __restrict__ K,
                                                             const uint8_t* __restrict__ V, float* __restrict__ out,
                                                             int64_t ldo, float* __restrict__ partial,
                                                             uint32_t* err) {
    pdl_start();
    __shared__ float qs[kMaxHeadDim];
    __shared__ float s[kChunk];
    __shared__ float ored[kThreads / 32][kMaxHeadDim];
    __shared__ float scratch[32];
    const int h = blockIdx.x, r = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int hd = a.head_dim, dim = a.n_head_kv * hd, col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int p = pos[r];
    float* o_final = out + int64_t(r) * ldo + int64_t(h) * hd;
    float* part = partial + ((int64_t(r) * a.n_head + h) * S + z) * (hd + 2);
    if (p < 0 || p >= a.n_ctx) {  // uniform over the block: no barrier is skipped by some threads only
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        for (int d = threadIdx.x; d < hd; d += kThreads) {
            if (S == 1) o_final[d] = 0.0f;
            else part[2 + d] = 0.0f;
        }
        if (S > 1 && threadIdx.x == 0) { part[0] = -INFINITY; part[1] = 0.0f; }
        return;
    }
    if (z * kChunk > p) return;  // nothing visible: the combine reads only splits z <= p / kChunk
    for (int d = threadIdx.x; d < hd; d += kThreads) qs[d] = q[int64_t(r) * ldq + int64_t(h) * hd + d];
    __syncthreads();

    float m = -INFINITY, l = 0.0f, o[kMaxHeadDim / kThreads] = {0.0f, 0.0f};
    for (int c = z; c * kChunk <= p; c += S) {
        const int j0 = c * kChunk, n = min(kChunk, p + 1 - j0);
        float sc = -INFINITY;
        if (int(threadIdx.x) < n) {
            float dot = 0.0f;
            // unrolled by 8 (a loop bounded by hd issued the row's loads one latency apart: about half the
            // kernel's time at a short context); fully unrolled, the registers cost more at long contexts
#pragma unroll 8
            for (int d0 = 0; d0 < kMaxHeadDim; d0 += 8) {
                if (d0 < hd) {
                    float kv[8];
                    kv_load8(a.kv_type, K, j0 + threadIdx.x, dim, col0 + d0, kv);
#pragma unroll
                    for (int i = 0; i < 8; i++) dot += qs[d0 + i] * kv[i];
                }
            }
            sc = dot * a.scale;
        }
        const float cm = block_max(sc, scratch);
        const float nm = fmaxf(m, cm), corr = expf(m - nm);  // exp(-inf) = 0 on the first chunk
        const float e = int(threadIdx.x) < n ? expf(sc - nm) : 0.0f;
        s[threadIdx.x] = e;
        const float cs = block_sum(e, scratch);  // its barriers also publish s[] to every thread
        l = l * corr + cs;
        m = nm;
        // this warp's 32 positions, lanes across dims
        float acc[kMaxHeadDim / 32];
#pragma unroll
        for (int i = 0; i < kMaxHeadDim / 32; i++) acc[i] = 0.0f;
        const int jw = warp * 32, jn = min(n, jw + 32);
#pragma unroll 8
        for (int jj = jw; jj < jn; jj++) {
            const float w = s[jj];
#pragma unroll
            for (int i = 0; i < kMaxHeadDim / 32; i++)
                if (lane + 32 * i < hd) acc[i] += w * kv_at(a.kv_type, V, j0 + jj, dim, col0 + lane + 32 * i);
        }
#pragma unroll
        for (int i = 0; i < kMaxHeadDim / 32; i++)
            if (lane + 32 * i < hd) ored[warp][lane + 32 * i] = acc[i];
        __syncthreads();
#pragma unroll
        for (int t = 0; t < kMaxHeadDim / kThreads; t++) {
            const int d = threadIdx.x + t * kThreads;
            if (d < hd) o[t] = o[t] * corr + ored[0][d] + ored[1][d] + ored[2][d] + ored[3][d];
        }
        __syncthreads();  // s[] and ored[] are rewritten by the next chunk
    }
#pragma unroll
    for (int t = 0; t < kMaxHeadDim / kThreads; t++) {
        const int d = threadIdx.x + t * kThreads;
        if (d < hd) {
            if (S == 1) o_final[d] = o[t] / l;
            else part[2 + d] = o[t];
        }
    }
    if (S > 1 && threadIdx.x == 0) {
        part[0] = m;
        part[1] = l;
    }
}

// The first block of a cluster waits for every block of it to have started before anyone writes into its
// shared memory (arrive at the start, wait before the write), and reads after a second barrier.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// The generic address of `p` (this block's shared memory) in the shared memory of block `rank` of the cluster.
__device__ __forceinline__ float* cluster_peer(float* p, unsigned rank) {
    uint64_t r;
    asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(r) : "l"(p), "r"(rank));
    return (float*)r;
}

// A warp's 32 rows of the K or V cache, coalesced: a row's HD / 8 lanes (LPR) read it whole, 16 bytes each, so
// one load instruction of the warp takes RPL whole rows (256 or 128 contiguous bytes each).  Load i of lane l is
// dims 8 (l % LPR) .. + 8 of row RPL i + l / LPR.  (When each lane read its own K row, every load instruction
// touched 32 different lines, eight times the L1 wavefronts for the same bytes; V was 4-byte loads.)  In
// chunk_attend the K rows' partial dots meet in a butterfly over the LPR lanes of a row that leaves lane l with
// the whole score of row pos(l).
template <int HD>
struct WarpRows {
    static constexpr int N = HD / 8, LPR = HD / 8, RPL = 32 / LPR;
    static __device__ __forceinline__ int row(int i, int lane) { return RPL * i + lane / LPR; }
    static __device__ __forceinline__ int pos(int lane) { return RPL * (lane % LPR) + lane / LPR; }
    static __device__ __forceinline__ int lane_of(int row) { return row / RPL + LPR * (row % RPL); }
    // rows j0 + r of the warp with lo <= j0 + r < hi, into r; the rest are left as they are, or with ZERO set to 0
    // (a V row past the position must read as 0, not as whatever the cache holds: its weight 0 times a NaN is NaN)
    template <bool ZERO = false>
    static __device__ __forceinline__ void load(uint4 (&r)[N], const __half* cache, int64_t dim, int col0, int j0,
                                                int lo, int hi) {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int i = 0; i < N; i++) {
            const int j = j0 + row(i, lane);
            if (j >= lo && j < hi) r[i] = *(const uint4*)(cache + int64_t(j) * dim + col0 + 8 * (lane % LPR));
            else if (ZERO) r[i] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
};

// One chunk's attention in a decode block (attention_decode_f16 and _cl): the warp scores its 32 positions
// j0.. j0 + 31 (kr: WarpRows' layout; lane l ends with position j0 + WarpRows::pos(l)), the warp's softmax and P V over
// its 32 V rows (vr: WarpRows' layout too, each lane summing its 8 dims over its rows, then the lanes of the same
// dims), then the four warps' (max, sum, output) merged in shared memory (wm, wl, wo).  Returns output value
// d = threadIdx.x (0 past HD) and sets the chunk's (M, L).
constexpr int kWarps = kThreads / 32;
template <int HD>
__device__ __forceinline__ float chunk_attend(const AttnShape& a, const uint4 (&kr)[HD / 8], const uint4 (&vr)[HD / 8],
                                              const float* qs, int j0, int p, float* wm, float* wl,
                                              float (&wo)[kWarps][HD], float& M, float& L) {
    using KR = WarpRows<HD>;
    constexpr int W = kWarps;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = threadIdx.x;
    const int j = j0 + KR::pos(lane);
    float qv[8];  // the 8 dims of q this lane's loads hold
#pragma unroll
    for (int t = 0; t < 8; t++) qv[t] = qs[8 * (lane % KR::LPR) + t];
    float part[KR::N];  // part[i]: this lane's 8 dims of row KR::row(i, lane)
#pragma unroll
    for (int i = 0; i < KR::N; i++) {
        const __half2* h2 = (const __half2*)&kr[i];
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const float2 f = __half22float2(h2[t]);
            s0 += qv[2 * t] * f.x;
            s1 += qv[2 * t + 1] * f.y;
        }
        part[i] = s0 + s1;
    }
    // butterfly over the row's LPR lanes: at mask m a lane keeps the half of its partials its bit m selects and
    // adds its partner's copy of that half; the last one left is row i = lane % LPR, whole
#pragma unroll
    for (int step = 1; step < KR::LPR; step *= 2) {
        const int m = KR::LPR / (2 * step), n = KR::N / step;
        const bool upper = lane & m;
#pragma unroll
        for (int k = 0; k < n / 2; k++) {
            const float send = upper ? part[k] : part[k + n / 2], keep = upper ? part[k + n / 2] : part[k];
            part[k] = keep + __shfl_xor_sync(0xffffffffu, send, m);
        }
    }
    const float sc = j <= p ? part[0] * a.scale : -INFINITY;  // rows past p were not loaded: their sums are unused
    const float m = warp_max(sc);  // -inf when none of the warp's positions is visible
    const float e = j <= p ? expf(sc - m) : 0.0f;
    const float l = warp_sum(e);
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // dims 8 (lane % LPR) .. + 8
#pragma unroll
    for (int i = 0; i < KR::N; i++) {
        // the weight of this lane's row i, from the lane that scored it (0 past the visible positions, whose V is 0)
        const float w = __shfl_sync(0xffffffffu, e, KR::lane_of(KR::row(i, lane)));
        const __half2* h2 = (const __half2*)&vr[i];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const float2 v = __half22float2(h2[t]);
            acc[2 * t] += w * v.x;
            acc[2 * t + 1] += w * v.y;
        }
    }
#pragma unroll
    for (int mk = KR::LPR; mk < 32; mk *= 2)  // the lanes holding the same dims of the other rows
#pragma unroll
        for (int t = 0; t < 8; t++) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], mk);
    if (lane == 0) wm[warp] = m, wl[warp] = l;
    if (lane < KR::LPR) {
#pragma unroll
        for (int t = 0; t < 8; t++) wo[warp][8 * lane + t] = acc[t];
    }
    __syncthreads();
    M = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; w++) M = fmaxf(M, wm[w]);
    float f[W];
    L = 0.0f;
#pragma unroll
    for (int w = 0; w < W; w++) {
        f[w] = wm[w] > -INFINITY ? expf(wm[w] - M) : 0.0f;
        L += f[w] * wl[w];
    }
    float o = 0.0f;
    if (d < HD) {
#pragma unroll
        for (int w = 0; w < W; w++) o += f[w] * wo[w][d];
    }
    return o;
}

// Decode (one query row) over an f16 cache, one block per (head, split of 128
// positions): each warp owns 32 of the positions -- one score per lane, a
// softmax within the warp, then P V with lanes across the head's dims (two per
// lane per 64) -- and the four warps merge their (max, sum, output) once, in
// shared memory.  Decode attention is a chain of memory latencies, not of
// bytes, so every load of a warp's K rows and V rows is issued first, into
// registers (the V rows do not depend on the scores), before q is even read:
// one round trip to memory instead of one per step of the loops.  HD is the
// head dim (64 or 128).  Its partials have the form of the general kernel's.
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_decode_f16(AttnShape a, const float* __restrict__ q,
                                                                const int32_t* __restrict__ pos,
                                                                const __half* __restrict__ K,
                                                                const __half* __restrict__ V, float* __restrict__ out,
                                                                float* __restrict__ partial, uint32_t* err) {
    constexpr int W = kThreads / 32;
    __shared__ float qs[HD];
    __shared__ float wm[W], wl[W];
    __shared__ float wo[W][HD];
    const int h = blockIdx.x, z = blockIdx.z, S = gridDim.z;
    const int dim = a.n_head_kv * HD, col0 = (h / (a.n_head / a.n_head_kv)) * HD;
    const int warp = threadIdx.x >> 5, d = threadIdx.x;
    const int p = pos[0];
    float* o_final = out + int64_t(h) * HD;
    float* part = partial + (int64_t(h) * S + z) * (HD + 2);
    if (p < 0 || p >= a.n_ctx) {  // uniform over the block
        pdl_start();
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        for (int d = threadIdx.x; d < HD; d += kThreads) {
            if (S == 1) o_final[d] = 0.0f;
            else part[2 + d] = 0.0f;
        }
        if (S > 1 && threadIdx.x == 0) part[0] = -INFINITY, part[1] = 0.0f;
        return;
    }
    // A split past the position holds nothing visible and the combine reads only splits z <= p / kChunk: it
    // leaves at once.  The grid has a split per chunk of the whole cache (n_ctx), so a short context in a
    // long cache is mostly such blocks (the benchmark's 512 positions in 4352: 29 of 34 splits).
    if (z * kChunk > p) return;
    const int j0 = z * kChunk + warp * 32;  // S * kChunk >= n_ctx: one chunk per split
    uint4 kr[HD / 8] = {};                   // the warp's K rows, WarpRows' layout
    uint4 vr[HD / 8];                        // the warp's V rows, the same layout
    // Rows before p were stored by earlier steps (the step's first kernel waits for the previous step), so they are
    // loaded before the wait, overlapping the kernels before; row p is this step's RoPE + KV store.
    WarpRows<HD>::load(kr, K, dim, col0, j0, 0, p);
    WarpRows<HD>::template load<true>(vr, V, dim, col0, j0, 0, p);
    pdl_start();
    WarpRows<HD>::load(kr, K, dim, col0, j0, p, p + 1);
    WarpRows<HD>::load(vr, V, dim, col0, j0, p, p + 1);
    for (int d = threadIdx.x; d < HD; d += kThreads) qs[d] = q[int64_t(h) * HD + d];
    __syncthreads();
    float M, L;
    const float o = chunk_attend<HD>(a, kr, vr, qs, j0, p, wm, wl, wo, M, L);
    if (d < HD) {
        if (S == 1) o_final[d] = L > 0.0f ? o / L : 0.0f;
        else part[2 + d] = o;
    }
    if (S > 1 && threadIdx.x == 0) part[0] = M, part[1] = L;
}

// attention_decode_f16's chunk arithmetic with its splits merged in the kernel: one thread-block cluster of
// C = gridDim.z (<= 8, cluster_merge_splits) blocks per head; block z takes chunks z, z + C, z + 2C, ... of the row's visible
// positions (merging them as it goes), then every block sends its (max, sum, output) to the cluster's first
// block through distributed shared memory, which merges the C of them in block order, writes the output and
// rounds it to 8-bit blocks (q8) for the O projection: no combine launch and no round trip through L2.  The
// grid no longer grows with the cache: 512 positions in the benchmark's 4352 are 4 busy blocks of 8 a head,
// where the per-chunk grid had 34 (29 with nothing to do).
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_decode_f16_cl(AttnShape a, const float* __restrict__ q,
                                                                const int32_t* __restrict__ pos,
                                                                const __half* __restrict__ K,
                                                                const __half* __restrict__ V, float* __restrict__ out,
                                                                uint32_t* err, Q8Act q8) {
    constexpr int W = kThreads / 32;
    static_assert(HD <= kThreads, "a thread per output value");
    __shared__ float qs[HD];
    __shared__ float wm[W], wl[W];
    __shared__ float wo[W][HD];
    __shared__ float inbox[kClusterSplits][HD + 2];  // the first block's, a slot per block of the cluster
    const int h = blockIdx.x, z = blockIdx.z, S = gridDim.z;
    const int dim = a.n_head_kv * HD, col0 = (h / (a.n_head / a.n_head_kv)) * HD;
    const int warp = threadIdx.x >> 5, d = threadIdx.x;
    const int p = pos[0];
    float* o_final = out + int64_t(h) * HD;
    if (p < 0 || p >= a.n_ctx) {  // uniform over the grid
        pdl_start();
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        if (d < HD && z == 0) o_final[d] = 0.0f;
        return;
    }
    // a block with no chunk (z past p / 128) runs through with no loads to send the empty partial (-inf, 0, 0)
    cluster_arrive_relaxed();
    uint4 kr[HD / 8] = {};  // the warp's K rows, WarpRows' layout
    uint4 vr[HD / 8];       // the warp's V rows, the same layout
    // Rows before p were stored by earlier steps (the step's first kernel waits for the previous step); row p is this step's
    // RoPE + KV store.  `early`: before the PDL wait, rows < p only.
    auto load_chunk = [&](int zc, bool early) {
        const int j0 = zc * kChunk + warp * 32, lim = early ? p : p + 1;
        WarpRows<HD>::load(kr, K, dim, col0, j0, 0, lim);
        WarpRows<HD>::template load<true>(vr, V, dim, col0, j0, 0, lim);
    };
    int zc = z;
    load_chunk(zc, true);
    pdl_start();
    {  // row p, if it is this block's first chunk's
        const int j0 = zc * kChunk + warp * 32;
        WarpRows<HD>::load(kr, K, dim, col0, j0, p, p + 1);
        WarpRows<HD>::load(vr, V, dim, col0, j0, p, p + 1);
    }
    if (d < HD) qs[d] = q[int64_t(h) * HD + d];
    __syncthreads();
    float Mb = -INFINITY, Lb = 0.0f, ob = 0.0f;  // the block's merge of its chunks so far (ob: value d)
    for (;;) {
        float M, L;
        const float o = chunk_attend<HD>(a, kr, vr, qs, zc * kChunk + warp * 32, p, wm, wl, wo, M, L);
        const float Mn = fmaxf(Mb, M), fb = Mb > -INFINITY ? expf(Mb - Mn) : 0.0f,
                    fc = M > -INFINITY ? expf(M - Mn) : 0.0f;
        Lb = fb * Lb + fc * L;
        ob = fb * ob + fc * o;
        Mb = Mn;
        zc += S;
        if (zc * kChunk > p) break;  // uniform over the block
        __syncthreads();             // wm, wl, wo are read before the next chunk writes them
        load_chunk(zc, false);
    }
    {
        const unsigned rank = unsigned(z);
        cluster_wait();  // every block of the cluster has started
        float* slot = cluster_peer(&inbox[rank][0], 0);
        if (d < HD) slot[2 + d] = ob;
        if (threadIdx.x == 0) slot[0] = Mb, slot[1] = Lb;
        cluster_arrive_release();
        if (rank != 0) return;  // nothing reads this block's shared memory
        cluster_wait();
        float M = -INFINITY;
        for (int i = 0; i < S; i++) M = fmaxf(M, inbox[i][0]);
        float L = 0.0f, o = 0.0f;
        for (int i = 0; i < S; i++) {
            const float w = inbox[i][0] > -INFINITY ? expf(inbox[i][0] - M) : 0.0f;
            L += w * inbox[i][1];
            if (d < HD) o += w * inbox[i][2 + d];
        }
        if (d < HD) {  // whole warps (HD % 32 == 0): a warp holds 32 consecutive values, as quantize_lane needs
            const float v = L > 0.0f ? o / L : 0.0f;
            o_final[d] = v;
            const int64_t col = int64_t(h) * HD + d;
            if (q8.q) quantize_lane(v, q8.q + col, q8.ds + col / 32);
        }
    }
}

// Merges the partials of each (row, head): weights exp(m_z - max m).  Only the
// splits that hold positions <= the row's (the rest are empty) are read.  The
// first warp reads every split's (m, l), lanes across splits, and leaves the
// weights in shared memory (S floats, dynamic), so that each output value is
// one pass of independent loads: a few memory round trips, not one per split.
// With q8.q the merged output is also rounded to 8-bit blocks of 32 (a warp
// holds 32 consecutive values of the head: head_dim % 32 == 0), for the O
// projection.
__global__ void attention_combine_kernel(AttnShape a, int S, const int32_t* __restrict__ pos,
                                         const float* __restrict__ partial, float* __restrict__ out, int64_t ldo,
                                         Q8Act q8) {
    extern __shared__ float wz[];  // [S]: exp(m_z - M)
    __shared__ float L_all;
    const int h = blockIdx.x, r = blockIdx.y, hd = a.head_dim, lane = threadIdx.x & 31;
    const int live = min(S, max(0, pos[r]) / kChunk + 1);  // positions: uploaded before the step
    pdl_start();
    const float* base = partial + (int64_t(r) * a.n_head + h) * S * (hd + 2);
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        for (int z = lane; z < live; z += 32) M = fmaxf(M, base[z * (hd + 2)]);
        M = warp_max(M);
        float L = 0.0f;
        for (int z = lane; z < live; z += 32) {
            const float mz = base[z * (hd + 2)];
            const float w = mz > -INFINITY ? expf(mz - M) : 0.0f;
            wz[z] = w;
            L += w * base[z * (hd + 2) + 1];
        }
        L = warp_sum(L);
        if (lane == 0) L_all = L;
    }
    __syncthreads();
    const float L = L_all;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        // 32 splits' loads in flight (all of them up to 4096 positions), then added in split order: one round
        // trip where the loop of dependent adds made one per split (CUDA_NOTES runs 97-98)
        for (int z0 = 0; z0 < live; z0 += 32) {
            float v[32];
#pragma unroll
            for (int u = 0; u < 32; u++) v[u] = z0 + u < live ? base[(z0 + u) * (hd + 2) + 2 + d] : 0.0f;
#pragma unroll
            for (int u = 0; u < 32; u++)
                if (z0 + u < live) acc += wz[z0 + u] * v[u];
        }
        const float o = L > 0.0f ? acc / L : 0.0f;
        const int64_t col = int64_t(h) * hd + d, K = int64_t(a.n_head) * hd;
        out[int64_t(r) * ldo + col] = o;
        if (q8.q) quantize_lane(o, q8.q + r * K + col, q8.ds + r * (K / 32) + col / 32);
    }
}

using namespace nvcuda;
constexpr int TQ = 64, TK = 64, kTcThreads = 128;

struct TcLayout {  // shared-memory carve-up for head_dim hd (rows padded against bank conflicts)
    int ldh, lds, ldp, ldo;
    size_t q, k, v, s, p, o, stats, bytes;
    __host__ __device__ explicit TcLayout(int hd) {
        ldh = hd + 8, lds = TK + 4, ldp = TK + 8, ldo = hd + 4;
        auto up = [](size_t x) { return (x + 127) / 128 * 128; };
        q = 0;
        k = up(q + size_t(TQ) * ldh * 2);
        v = up(k + size_t(TK) * ldh * 2);
        s = up(v + size_t(TK) * ldh * 2);
        p = up(s + size_t(TQ) * lds * 4);
        o = up(p + size_t(TQ) * ldp * 2);
        stats = up(o + size_t(TQ) * ldo * 4);
        bytes = stats + 3 * TQ * 4 + 32 * 4;
    }
};

__global__ void __launch_bounds__(kTcThreads) attention_prefill_tc(AttnShape a, const float* __restrict__ q, int64_t ldq,
                                                                    const int32_t* __restrict__ pos,
                                                                    const __half* __restrict__ K,
                                                                    const __half* __restrict__ V,
                                                                    float* __restrict__ out, int64_t ldo_g, uint32_t* err) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int hd = a.head_dim;
    const TcLayout L(hd);
    __half* Qs = (__half*)(smem + L.q);
    __half* Ks = (__half*)(smem + L.k);
    __half* Vs = (__half*)(smem + L.v);
    float* Ss = (float*)(smem + L.s);
    __half* Ps = (__half*)(smem + L.p);
    float* Os = (float*)(smem + L.o);
    float* m_row = (float*)(smem + L.stats);
    float* l_row = m_row + TQ;
    int* p_row = (int*)(l_row + TQ);
    float* scratch = (float*)(p_row + TQ);
    const int h = blockIdx.x, r0 = blockIdx.y * TQ;
    const int dim = a.n_head_kv * hd, col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    // Rows of this tile: position (-1 past the last row), Q as f16, O = 0.
    float last = -1.0f;
    for (int i = threadIdx.x; i < TQ; i += kTcThreads) {
        int p = r0 + i < a.rows ? pos[r0 + i] : -1;
        if (p >= a.n_ctx || (r0 + i < a.rows && p < 0)) {
            atomicOr(err, kBadPosition);
            p = -1;
        }
        p_row[i] = p;
        m_row[i] = -INFINITY;
        l_row[i] = 0.0f;
        last = fmaxf(last, float(p));
    }
    for (int e = threadIdx.x; e < TQ * hd; e += kTcThreads) {
        const int i = e / hd, d = e % hd;
        const float v = r0 + i < a.rows ? q[int64_t(r0 + i) * ldq + int64_t(h) * hd + d] : 0.0f;
        Qs[i * L.ldh + d] = __float2half_rn(v);
        Os[i * L.ldo + d] = 0.0f;
    }
    const int j_end = int(block_max(last, scratch)) + 1;  // barriers inside also publish the stores above

    for (int j0 = 0; j0 < j_end; j0 += TK) {
        // K and V tiles: 8 halves per load; cells past the cache end are zeros (and masked).
        for (int e = threadIdx.x; e < TK * hd / 8; e += kTcThreads) {
            const int j = e / (hd / 8), d = (e % (hd / 8)) * 8;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (j0 + j < a.n_ctx) {
                kv = *(const uint4*)(K + int64_t(j0 + j) * dim + col0 + d);
                vv = *(const uint4*)(V + int64_t(j0 + j) * dim + col0 + d);
            }
            *(uint4*)(Ks + j * L.ldh + d) = kv;
            *(uint4*)(Vs + j * L.ldh + d) = vv;
        }
        __syncthreads();
        // S rows [16 warp, 16 warp + 16) = Q K^T
        for (int n = 0; n < TK / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < hd; k += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, Qs + (warp * 16) * L.ldh + k, L.ldh);
                wmma::load_matrix_sync(fb, Ks + (n * 16) * L.ldh + k, L.ldh);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Ss + (warp * 16) * L.lds + n * 16, acc, L.lds, wmma::mem_row_major);
        }
        __syncwarp();
        // Online softmax of the warp's 16 rows: two lanes per row, 32 columns each.
        {
            const int i = warp * 16 + lane / 2, c0 = (lane % 2) * 32, p = p_row[i];
            float mx = -INFINITY;
            for (int c = 0; c < 32; c++) {
                const int j = j0 + c0 + c;
                const float sv = j <= p ? Ss[i * L.lds + c0 + c] * a.scale : -INFINITY;
                Ss[i * L.lds + c0 + c] = sv;
                mx = fmaxf(mx, sv);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float m_old = m_row[i], m_new = fmaxf(m_old, mx);
            const float corr = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
            float sum = 0.0f;
            for (int c = 0; c < 32; c++) {
                const float sv = Ss[i * L.lds + c0 + c];
                const float e = sv == -INFINITY ? 0.0f : expf(sv - m_new);
                const __half eh = __float2half_rn(e);
                Ps[i * L.ldp + c0 + c] = eh;
                sum += __half2float(eh);  // the sum of what P V will weigh
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            __syncwarp();
            if (lane % 2 == 0) {
                m_row[i] = m_new;
                l_row[i] = l_row[i] * corr + sum;
            }
            // rescale this row's half of O
            for (int d = (lane % 2) * (hd / 2); d < (lane % 2 + 1) * (hd / 2); d++) Os[i * L.ldo + d] *= corr;
        }
        __syncwarp();
        // O rows of the warp += P V
        for (int n = 0; n < hd / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, Os + (warp * 16) * L.ldo + n * 16, L.ldo, wmma::mem_row_major);
            for (int k = 0; k < TK; k += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, Ps + (warp * 16) * L.ldp + k, L.ldp);
                wmma::load_matrix_sync(fb, Vs + k * L.ldh + n * 16, L.ldh);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Os + (warp * 16) * L.ldo + n * 16, acc, L.ldo, wmma::mem_row_major);
        }
        __syncthreads();  // K/V tiles are reloaded next
    }
    for (int e = threadIdx.x; e < TQ * hd; e += kTcThreads) {
        const int i = e / hd, d = e % hd;
        if (r0 + i < a.rows) {
            const float l = l_row[i];
            out[int64_t(r0 + i) * ldo_g + int64_t(h) * hd + d] = l > 0.0f ? Os[i * L.ldo + d] / l : 0.0f;
        }
    }
}

}  // namespace

// Decode over an f16 cache takes the warp-split kernels; the kernel choice cuda.attention=general forces the
// general one (tests compare them).
bool decode_f16_kernel_on() { return forced_kernel("cuda.attention") != "general"; }

// The blocks a head of the cluster merge (attention_decode_f16_cl), or 0 for the split grid and the combine.
// The cluster merge takes decode where each of its blocks walks one chunk (S <= 8: the split grid's
// parallelism without the combine launch) or where its n_head x 8 blocks fill the GPU.  With fewer heads and
// more than 8 splits, each cluster block walks several chunks and the split grid's wider parallelism measured
// faster at long contexts.  The kernel choice cuda.attention_merge forces one (tests).
int cluster_merge_splits(const AttnShape& a, int S) {
    const std::string v = forced_kernel("cuda.attention_merge");
    const int C = std::min(S, kClusterSplits);
    if (v == "cluster") return C;
    if (v == "combine") return 0;
    const int sms = sm_count();
    return S <= kClusterSplits || int64_t(a.n_head) * C >= sms ? C : 0;
}

bool attention_uses_tensor_cores(const AttnShape& a) {
    return a.rows >= 16 && a.kv_type == GGML_TYPE_F16 && (a.head_dim == 64 || a.head_dim == 128);
}

int attention_splits(const AttnShape& a) {
    if (attention_uses_tensor_cores(a)) return 1;
    return a.rows == 1 ? (a.n_ctx + kChunk - 1) / kChunk : 1;
}

size_t attention_scratch_floats(const AttnShape& a) {
    const int S = attention_splits(a);
    return S > 1 ? size_t(a.rows) * size_t(a.n_head) * size_t(S) * size_t(a.head_dim + 2) : 0;
}

void attention(const AttnShape& a, const float* q, int64_t ldq, const int32_t* pos, const void* K, const void* V,
               float* out, int64_t ldo, float* scratch, uint32_t* err, Q8Act q8, cudaStream_t s) {
    if (q8.q && a.head_dim % 32)
        throw MinferError(strfmt("CUDA attention: 8-bit output needs head_dim %% 32 == 0, got %d", a.head_dim));
    if (a.head_dim > kMaxHeadDim || a.n_head_kv <= 0 || a.n_head % a.n_head_kv)
        throw MinferError(strfmt("CUDA attention: head_dim %d (at most %d), %d heads over %d KV heads", a.head_dim,
                                 kMaxHeadDim, a.n_head, a.n_head_kv));
    if (attention_uses_tensor_cores(a)) {
        const TcLayout L(a.head_dim);
        static bool raised = false;  // the opt-in above 48 KB of shared memory, once per process
        if (!raised) {
            cudaError_t e = cudaFuncSetAttribute(attention_prefill_tc, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 int(TcLayout(128).bytes));
            if (e != cudaSuccess) throw MinferError(strfmt("CUDA attention: %s", cudaGetErrorString(e)));
            raised = true;
        }
        attention_prefill_tc<<<dim3(unsigned(a.n_head), unsigned((a.rows + TQ - 1) / TQ)), kTcThreads, L.bytes, s>>>(
            a, q, ldq, pos, (const __half*)K, (const __half*)V, out, ldo, err);
        return check_launch("attention_prefill_tc");
    }
    const int S = attention_splits(a);
    if (size_t(S) * sizeof(float) > 48 * 1024)  // the combine's weights live in shared memory
        throw MinferError(strfmt("CUDA attention: a context of %d positions (at most %d)", a.n_ctx, 12288 * kChunk));
    const bool fast = a.rows == 1 && a.kv_type == GGML_TYPE_F16 && (a.head_dim == 64 || a.head_dim == 128);
    const unsigned C = fast && decode_f16_kernel_on() && S > 1 ? unsigned(cluster_merge_splits(a, S)) : 0u;
    if (C) {  // one cluster of C splits a head, merging in distributed shared memory
        launch_in_clusters("attention_decode_cl", a.head_dim == 64 ? attention_decode_f16_cl<64> : attention_decode_f16_cl<128>,
                           dim3(unsigned(a.n_head), 1u, C), dim3(kThreads), 0, s, C, a, q, pos, (const __half*)K,
                           (const __half*)V, out, err, q8);
        return;
    }
    if (fast && decode_f16_kernel_on()) {
        launch("attention_decode", a.head_dim == 64 ? attention_decode_f16<64> : attention_decode_f16<128>,
               dim3(unsigned(a.n_head), 1u, unsigned(S)), dim3(kThreads), 0, s, a, q, pos, (const __half*)K,
               (const __half*)V, out, scratch, err);
    } else {
        launch("attention", attention_kernel, dim3(unsigned(a.n_head), unsigned(a.rows), unsigned(S)), dim3(kThreads), 0, s,
               a, q, ldq, pos, (const uint8_t*)K, (const uint8_t*)V, out, ldo, scratch, err);
    }
    if (S > 1)
        launch("attention_combine", attention_combine_kernel, dim3(unsigned(a.n_head), unsigned(a.rows)), dim3(128),
               size_t(S) * sizeof(float), s, a, S, pos, (const float*)scratch, out, ldo, q8);
}

}  // namespace minfer::cuda
