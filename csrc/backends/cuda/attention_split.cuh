// The general attention kernel (any KV type, any rows, the KV length split over blocks) and the combine
// kernel that merges the splits' partials (flash decoding).  Reference: tests/test_cuda_attention.py
// (test_kvstore_attention, test_decode_attention_kernels_agree: against the reference backend).
#pragma once
// Included once, by attention.cu, inside its anonymous namespace (one translation unit: the constants and
// helpers there, and the same code as when it was one file).

// Per chunk of 128 positions: each thread scores one position (its K row read
// in 16-byte pieces, all in flight at once); after the block's max and sum,
// each warp accumulates P V over 32 positions with lanes across head dims,
// and the four warps' sums meet in shared memory.
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnShape a, const float* __restrict__ q, int64_t ldq,
                                                             const int32_t* __restrict__ pos,
                                                             const uint8_t* __restrict__ K,
                                                             const uint8_t* __restrict__ V, float* __restrict__ out,
                                                             int64_t ldo, float* __restrict__ partial,
                                                             uint32_t* err, KvPages pg) {
    pdl_start();
    __shared__ float qs[kMaxHeadDim];
    __shared__ float s[kChunk];
    __shared__ float ored[kThreads / 32][kMaxHeadDim];
    __shared__ float scratch[32];
    const int h = blockIdx.x, r = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int hd = a.head_dim, dim = a.n_head_kv * hd, col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int p = pos[r];
    // the cache row of key j: j, its row in a local layer's ring, or through the row's sequence's block table
    // (a batch step)
    const int32_t* tbl = pg.seq ? pg.tables + int64_t(pg.seq[r]) * pg.max_blocks : nullptr;
    auto row_of = [&](int j) -> int64_t {
        return tbl ? int64_t(tbl[j / pg.block_size]) * pg.block_size + j % pg.block_size
                   : kv_cache_row(j, a.ring);
    };
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

    const int lo = a.window > 0 ? max(0, p - a.window + 1) : 0;  // the first key the row sees
    float m = -INFINITY, l = 0.0f, o[kMaxHeadDim / kThreads] = {0.0f, 0.0f};
    for (int c = z; c * kChunk <= p; c += S) {
        if ((c + 1) * kChunk <= lo) continue;  // wholly before the window (uniform over the block)
        const int j0 = c * kChunk, n = min(kChunk, p + 1 - j0);
        const bool seen = int(threadIdx.x) < n && j0 + int(threadIdx.x) >= lo;
        float sc = -INFINITY;
        if (seen) {
            float dot = 0.0f;
            // unrolled by 8 (a loop bounded by hd issued the row's loads one latency apart: about half the
            // kernel's time at a short context); fully unrolled, the registers cost more at long contexts
#pragma unroll 8
            for (int d0 = 0; d0 < kMaxHeadDim; d0 += 8) {
                if (d0 < hd) {
                    float kv[8];
                    kv_load8(a.kv_type, K, row_of(j0 + int(threadIdx.x)), dim, col0 + d0, kv);
#pragma unroll
                    for (int i = 0; i < 8; i++) dot += qs[d0 + i] * kv[i];
                }
            }
            sc = dot * a.scale;
        }
        const float cm = block_max(sc, scratch);
        const float nm = fmaxf(m, cm), corr = expf(m - nm);  // exp(-inf) = 0 on the first chunk
        const float e = seen ? expf(sc - nm) : 0.0f;
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
        for (int jj = max(jw, lo - j0); jj < jn; jj++) {
            const float w = s[jj];
#pragma unroll
            for (int i = 0; i < kMaxHeadDim / 32; i++)
                if (lane + 32 * i < hd) acc[i] += w * kv_at(a.kv_type, V, row_of(j0 + jj), dim, col0 + lane + 32 * i);
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

// Merges the partials of each (row, head): weights exp(m_z - max m).  Only the
// splits that hold positions <= the row's (the rest are empty) are read.  The
// first warp reads every split's (m, l), lanes across splits, and leaves the
// weights in shared memory (S floats, dynamic), so that each output value is
// one pass of independent loads: a few memory round trips, not one per split.
// With q8.q the merged output is also rounded to 8-bit blocks of 32 (a warp
// holds 32 consecutive values of the head: head_dim % 32 == 0), for the O
// projection; with xb.p, written in gemm_mma's layout (a batch step's O product).
__global__ void attention_combine_kernel(AttnShape a, int S, const int32_t* __restrict__ pos,
                                         const float* __restrict__ partial, float* __restrict__ out, int64_t ldo,
                                         Q8Act q8, MmaAct xb) {
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
        // trip where the loop of dependent adds made one per split
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
        if (xb.p) mma_act_store((__nv_bfloat16*)xb.p, xb.rows, r, col, o);
    }
}
