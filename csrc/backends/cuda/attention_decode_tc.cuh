// Decode attention on the tensor cores for a GQA group: one block per (KV head, row, split) attends all G <= 8
// query heads of the KV head at once, so each K and V row is read once a KV head (the warp kernels read it
// once a query head: G times the L2 traffic, which capped a 32k decode near a quarter of the copy rate).
// Reference: tests/test_cuda_attention.py (test_long_decode_attention: the float64 forward).
//
// A warp takes 16 positions at a time as one mma.sync m16n8k16 tile, with the group's heads as the 8 columns
// (transposed products, so no MMA row is padding): S^T = K Q^T (K rows are the A operand, loaded from global
// memory straight into fragments), an online softmax per head column, then O^T += V^T P^T.  The dot products
// do not care in what order the head's dims are summed, so a lane's fragments are the dims its 16-byte loads
// hold: K dims 32c + 8t.. of keys g and g + 8, V dims 64c + 8g.. of keys 2t, 2t + 1, 2t + 8, 2t + 9 (one
// byte_perm pairs two keys' values of a dim).  P leaves the S^T accumulators keyed by row and enters P^T's B
// operand keyed by head: four shuffles move it.  Q and P are rounded to f16 as in the prefill kernel.
//
// The block's four warps take chunks of 128 positions (two tiles of 16 each); split z walks chunks z, z + S,
// z + 2S, ..., one tile in flight while the warp computes the one before (two at the start), so a block
// streams its share of the cache instead of loading it all and then computing.  The four warps merge their
// (max, sum, O) in shared memory; splits are merged by the combine kernel (partials of the warp kernels'
// form: max in natural-log units).
#pragma once
// Included once, by attention.cu, inside its anonymous namespace, after attention_prefill.cuh (mma_f16,
// pack_f16).

constexpr int kTcGroup = 8;  // query heads of one KV head a decode block takes (the MMA's N)

// A warp's 16 positions j0 + 0..15 in registers: k[i][c] key j0 + g + 8i, dims 32c + 8t ..; v[e][c] key
// j0 + 2t + (e & 1) + 8 (e >> 1), dims 64c + 8g ..
template <int HD>
struct TcRows {
    uint4 k[2][HD / 32], v[4][HD / 64];
    // rows lo <= j < hi from `row0` (the cache row of position j0; the 16 are consecutive rows); with ZERO
    // the others set to 0 (a V row's weight 0 times a NaN would be NaN), else left as they are
    template <bool ZERO>
    __device__ __forceinline__ void load(const __half* K, const __half* V, int64_t row0, int dim, int col0, int j0,
                                         int lo, int hi) {
        const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int j = g + 8 * i;
            const bool in = j0 + j >= lo && j0 + j < hi;
#pragma unroll
            for (int c = 0; c < HD / 32; c++) {
                if (in) k[i][c] = *(const uint4*)(K + (row0 + j) * dim + col0 + 32 * c + 8 * t);
                else if (ZERO) k[i][c] = zero;
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = 2 * t + (e & 1) + 8 * (e >> 1);
            const bool in = j0 + j >= lo && j0 + j < hi;
#pragma unroll
            for (int c = 0; c < HD / 64; c++) {
                if (in) v[e][c] = *(const uint4*)(V + (row0 + j) * dim + col0 + 64 * c + 8 * g);
                else if (ZERO) v[e][c] = zero;
            }
        }
    }
};

// q, K and V are not __restrict__: the kernel before this one writes q and row p while this one may already
// run (programmatic dependent launch), and read-only pointers let the compiler take their loads through the
// non-coherent path and move them before the wait.
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_decode_tc(AttnShape a, const float* q,
                                                                const int32_t* __restrict__ pos,
                                                                const __half* K,
                                                                const __half* V, float* __restrict__ out,
                                                                float* __restrict__ partial, uint32_t* err, KvPages pg,
                                                                int64_t ldq, int64_t ldo, MmaAct xb) {
    constexpr int W = kThreads / 32, KC = HD / 32, MT = HD / 16;
    __shared__ float wm[W][kTcGroup], wl[W][kTcGroup];
    __shared__ __align__(16) float wo[W][kTcGroup][HD];
    const int G = a.n_head / a.n_head_kv, kvh = blockIdx.x, h0 = kvh * G;
    const int r = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int dim = a.n_head_kv * HD, col0 = kvh * HD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int p = pos[r];
    auto part = [&](int h) { return partial + ((int64_t(r) * a.n_head + h) * S + z) * (HD + 2); };
    if (p < 0 || p >= a.n_ctx) {  // uniform over the block
        pdl_start();
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        for (int e = threadIdx.x; e < G * HD; e += kThreads) {
            const int h = h0 + e / HD, d = e % HD;
            if (S == 1) {
                out[int64_t(r) * ldo + int64_t(h) * HD + d] = 0.0f;
                if (xb.p) mma_act_store((__nv_bfloat16*)xb.p, xb.rows, r, int64_t(h) * HD + d, 0.0f);
            } else {
                part(h)[2 + d] = 0.0f;
            }
        }
        if (S > 1 && threadIdx.x < G) part(h0 + threadIdx.x)[0] = -INFINITY, part(h0 + threadIdx.x)[1] = 0.0f;
        return;
    }
    if (z * kChunk > p) return;  // nothing visible: the combine reads only splits z <= p / kChunk
    const int n_tiles = 2 * ((p / kChunk - z) / S + 1);
    // the cache row of position j0 (a warp's 16 positions lie in one pool block: block_size % 16 == 0)
    const int32_t* tbl = pg.seq ? pg.tables + int64_t(pg.seq[r]) * pg.max_blocks : nullptr;
    auto row_of = [&](int j0) -> int64_t {  // 0 for positions past p (not loaded; maybe past the table's end)
        if (!tbl) return j0;
        return j0 <= p ? int64_t(tbl[j0 / pg.block_size]) * pg.block_size + j0 % pg.block_size : 0;
    };
    auto first_of = [&](int tile) { return (z + (tile >> 1) * S) * kChunk + 32 * warp + 16 * (tile & 1); };

    // Every load after the wait: loading the rows before p earlier (as the warp kernels do), through read-only
    // pointers, gave a decode step's attention different bits from run to run in eager steps.
    pdl_start();
    TcRows<HD> cur, nxt;  // tiles i and i + 1
    {
        const int j0 = first_of(0), j1 = first_of(1);
        cur.template load<true>(K, V, row_of(j0), dim, col0, j0, 0, p + 1);
        nxt.template load<true>(K, V, row_of(j1), dim, col0, j1, 0, p + 1);
    }
    // Q^T as B fragments, k-step 2c + u: b0 = dims 32c + 8t + 4u + {0, 1} of head g, b1 = the next two (the
    // dims a0 and a2 of K hold); heads past the group are 0.
    uint32_t qf[MT][2];
    {
        const float* qh = q + int64_t(r) * ldq + int64_t(h0 + g) * HD;
#pragma unroll
        for (int c = 0; c < KC; c++) {
            float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
            if (g < G) x0 = *(const float4*)(qh + 32 * c + 8 * t), x1 = *(const float4*)(qh + 32 * c + 8 * t + 4);
            qf[2 * c][0] = pack_f16(x0.x, x0.y), qf[2 * c][1] = pack_f16(x0.z, x0.w);
            qf[2 * c + 1][0] = pack_f16(x1.x, x1.y), qf[2 * c + 1][1] = pack_f16(x1.z, x1.w);
        }
    }
    const float scale_log2 = a.scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // heads 2t, 2t + 1
    // O^T: tile i holds dims d_i = 64 (i / 4) + 8 g + 2 (i % 4) (rows g) and d_i + 1 (rows g + 8); columns
    // heads 2t, 2t + 1
    float o[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (int tile = 0; tile < n_tiles; tile++) {
        const int j0 = first_of(tile);
        // S^T: s[0..1] key j0 + g, heads 2t, 2t + 1; s[2..3] key j0 + g + 8
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < KC; c++) {
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const uint32_t* k0 = (const uint32_t*)&cur.k[0][c];
                const uint32_t* k1 = (const uint32_t*)&cur.k[1][c];
                const uint32_t af[4] = {k0[2 * u], k1[2 * u], k0[2 * u + 1], k1[2 * u + 1]};
                mma_f16(s, af, qf[2 * c + u][0], qf[2 * c + u][1]);
            }
        }
        // online softmax per head column (log2 units): the lanes of one t hold a column
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int c = 0; c < 4; c++) {
            s[c] = j0 + g + 8 * (c >> 1) <= p ? s[c] * scale_log2 : -INFINITY;
            mx[c & 1] = fmaxf(mx[c & 1], s[c]);
        }
        float corr[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
#pragma unroll
            for (int o = 4; o < 32; o *= 2) mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], o));
            const float m_new = fmaxf(m_run[e], mx[e]);
            corr[e] = m_new == -INFINITY ? 1.0f : exp2f(m_run[e] - m_new);  // exp2(-inf) = 0 at the first keys
            m_run[e] = m_new;
        }
        float e4[4];
#pragma unroll
        for (int c = 0; c < 4; c++) e4[c] = s[c] == -INFINITY ? 0.0f : exp2f(s[c] - m_run[c & 1]);
        const uint32_t lo = pack_f16(e4[0], e4[1]), hi = pack_f16(e4[2], e4[3]);  // key g, key g + 8
        const float2 flo = __half22float2(*(const __half2*)&lo), fhi = __half22float2(*(const __half2*)&hi);
        float sum[2] = {flo.x + fhi.x, flo.y + fhi.y};  // the sums add the rounded weights P V will use
#pragma unroll
        for (int e = 0; e < 2; e++) {
#pragma unroll
            for (int o = 4; o < 32; o *= 2) sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], o);
            l_run[e] = l_run[e] * corr[e] + sum[e];
        }
        // P^T's B fragment: b0 keys 2t, 2t + 1 of head g, b1 keys 2t + 8, 2t + 9.  Key k's pair of heads
        // (2(g/2), +1) is in lane 4k + g/2: take keys 2t and 2t + 1, keep head g's half.
        const int src = 8 * t + (g >> 1);
        const uint32_t sel = (g & 1) ? 0x7632u : 0x5410u;
        const uint32_t x0 = __shfl_sync(0xffffffffu, lo, src), x1 = __shfl_sync(0xffffffffu, lo, src + 4);
        const uint32_t y0 = __shfl_sync(0xffffffffu, hi, src), y1 = __shfl_sync(0xffffffffu, hi, src + 4);
        const uint32_t b0 = __byte_perm(x0, x1, sel), b1 = __byte_perm(y0, y1, sel);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            o[i][0] *= corr[0], o[i][2] *= corr[0];
            o[i][1] *= corr[1], o[i][3] *= corr[1];
            const uint32_t w0 = ((const uint32_t*)&cur.v[0][i / 4])[i % 4], w1 = ((const uint32_t*)&cur.v[1][i / 4])[i % 4];
            const uint32_t w2 = ((const uint32_t*)&cur.v[2][i / 4])[i % 4], w3 = ((const uint32_t*)&cur.v[3][i / 4])[i % 4];
            const uint32_t af[4] = {__byte_perm(w0, w1, 0x5410u), __byte_perm(w0, w1, 0x7632u),
                                    __byte_perm(w2, w3, 0x5410u), __byte_perm(w2, w3, 0x7632u)};
            mma_f16(o[i], af, b0, b1);
        }
        cur = nxt;
        if (tile + 2 < n_tiles) {  // the tile after next in flight while the next one computes
            const int j2 = first_of(tile + 2);
            nxt.template load<true>(K, V, row_of(j2), dim, col0, j2, 0, p + 1);
        }
    }
    // the four warps' (max, sum, O) merged in shared memory
    if (g == 0) {
        wm[warp][2 * t] = m_run[0], wm[warp][2 * t + 1] = m_run[1];
        wl[warp][2 * t] = l_run[0], wl[warp][2 * t + 1] = l_run[1];
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const int d = 64 * (i / 4) + 8 * g + 2 * (i % 4);
        *(float2*)&wo[warp][2 * t][d] = make_float2(o[i][0], o[i][2]);
        *(float2*)&wo[warp][2 * t + 1][d] = make_float2(o[i][1], o[i][3]);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * HD; e += kThreads) {
        const int hh = e / HD, d = e % HD, h = h0 + hh;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) M = fmaxf(M, wm[w][hh]);
        float L = 0.0f, acc = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float f = wm[w][hh] > -INFINITY ? exp2f(wm[w][hh] - M) : 0.0f;
            L += f * wl[w][hh];
            acc += f * wo[w][hh][d];
        }
        if (S == 1) {  // with xb.p, also in gemm_mma's layout (a batch step's O product)
            const float o = L > 0.0f ? acc / L : 0.0f;
            out[int64_t(r) * ldo + int64_t(h) * HD + d] = o;
            if (xb.p) mma_act_store((__nv_bfloat16*)xb.p, xb.rows, r, int64_t(h) * HD + d, o);
        } else {
            float* pp = part(h);
            pp[2 + d] = acc;
            if (d == 0) pp[0] = M * 0.6931471805599453f, pp[1] = L;  // the combine weighs by exp(max)
        }
    }
}
