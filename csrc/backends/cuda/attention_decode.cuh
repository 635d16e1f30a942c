// Decode attention over an f16 cache: a warp reads K and V rows coalesced (16-byte loads), the splits of a
// head merged by the combine kernel (attention_decode_f16) or inside one thread-block cluster through
// distributed shared memory (attention_decode_f16_cl).  Reference: tests/test_cuda_attention.py
// (test_decode_attention_kernels_agree, test_decode_attention_cluster_merge; the sanitizer's attention case).
#pragma once
// Included once, by attention.cu, inside its anonymous namespace (one translation unit: the constants and
// helpers there, and the same code as when it was one file).

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
// A batch step (pg.seq set) runs every row at once, blockIdx.y = row, each over its own sequence's blocks: a
// warp's 32 positions lie in one pool block (block_size a multiple of 32), so its loads stay as they are,
// from that block.  `group` query heads share a block (blockIdx.x heads group x .. group x + group - 1, all of
// one KV head): the K and V rows are loaded once and attended by each head in turn, so a batch of many rows
// reads each sequence's cache once a KV head, not once a query head (GROUPED: built apart, since keeping the
// rows live across the heads costs registers the one-head build should not pay).
template <int HD, bool GROUPED = false>
__global__ void __launch_bounds__(kThreads) attention_decode_f16(AttnShape a, const float* __restrict__ q,
                                                                const int32_t* __restrict__ pos,
                                                                const __half* __restrict__ K,
                                                                const __half* __restrict__ V, float* __restrict__ out,
                                                                float* __restrict__ partial, uint32_t* err,
                                                                KvPages pg, int64_t ldq, int64_t ldo, int group) {
    constexpr int W = kThreads / 32;
    const int G = GROUPED ? group : 1;
    __shared__ float qs[HD];
    __shared__ float wm[W], wl[W];
    __shared__ float wo[W][HD];
    const int h0 = blockIdx.x * G, r = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int dim = a.n_head_kv * HD, col0 = (h0 / (a.n_head / a.n_head_kv)) * HD;
    const int warp = threadIdx.x >> 5, d = threadIdx.x;
    const int p = pos[r];
    auto o_final = [&](int h) { return out + int64_t(r) * ldo + int64_t(h) * HD; };
    auto part = [&](int h) { return partial + ((int64_t(r) * a.n_head + h) * S + z) * (HD + 2); };
    if (p < 0 || p >= a.n_ctx) {  // uniform over the block
        pdl_start();
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        for (int g = 0; g < G; g++) {
            const int h = h0 + g;
            for (int d = threadIdx.x; d < HD; d += kThreads) {
                if (S == 1) o_final(h)[d] = 0.0f;
                else part(h)[2 + d] = 0.0f;
            }
            if (S > 1 && threadIdx.x == 0) part(h)[0] = -INFINITY, part(h)[1] = 0.0f;
        }
        return;
    }
    // A split past the position holds nothing visible and the combine reads only splits z <= p / kChunk: it
    // leaves at once.  The grid has a split per chunk of the whole cache (n_ctx), so a short context in a
    // long cache is mostly such blocks (the benchmark's 512 positions in 4352: 29 of 34 splits).
    if (z * kChunk > p) return;
    const int j0 = z * kChunk + warp * 32;  // S * kChunk >= n_ctx: one chunk per split
    if (pg.seq) {  // the warp's rows j0.. j0 + 31 are rows of one pool block: shift the cache to it
        const int b = pg.tables[int64_t(pg.seq[r]) * pg.max_blocks + j0 / pg.block_size];
        const int64_t shift = (int64_t(b) * pg.block_size + j0 % pg.block_size - j0) * dim;
        K += shift;
        V += shift;
    }
    uint4 kr[HD / 8] = {};                   // the warp's K rows, WarpRows' layout
    uint4 vr[HD / 8];                        // the warp's V rows, the same layout
    // Rows before p were stored by earlier steps (the step's first kernel waits for the previous step), so they are
    // loaded before the wait, overlapping the kernels before; row p is this step's RoPE + KV store.
    WarpRows<HD>::load(kr, K, dim, col0, j0, 0, p);
    WarpRows<HD>::template load<true>(vr, V, dim, col0, j0, 0, p);
    pdl_start();
    WarpRows<HD>::load(kr, K, dim, col0, j0, p, p + 1);
    WarpRows<HD>::load(vr, V, dim, col0, j0, p, p + 1);
    for (int g = 0; g < G; g++) {
        const int h = h0 + g;
        if (g > 0) __syncthreads();  // every warp is done with the previous head's q and merge
        for (int i = threadIdx.x; i < HD; i += kThreads) qs[i] = q[int64_t(r) * ldq + int64_t(h) * HD + i];
        __syncthreads();
        float M, L;
        const float o = chunk_attend<HD>(a, kr, vr, qs, j0, p, wm, wl, wo, M, L);
        if (d < HD) {
            if (S == 1) o_final(h)[d] = L > 0.0f ? o / L : 0.0f;
            else part(h)[2 + d] = o;
        }
        if (S > 1 && threadIdx.x == 0) part(h)[0] = M, part(h)[1] = L;
    }
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
