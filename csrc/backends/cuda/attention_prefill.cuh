// Prefill attention on the tensor cores (f16 cache, head_dim 64 or 128), flash-attention style with every
// intermediate in registers: a block of WARPS warps takes 16 query rows of one head a warp and walks the
// visible keys in tiles of 64, loaded by cp.async one tile ahead.  A warp computes its 16 x 64 scores with
// mma.sync m16n8k16 (f16 in, f32 out), masks and exponentiates them in f32 with a running max and sum, turns
// the accumulators into the f16 A operand of O += P V in place, and rescales its O accumulators row by row.
// Key tiles past a warp's last row are skipped; only tiles that cross a row's position are masked.
// Reference: tests/test_cuda_attention.py (test_kvstore_attention, test_long_prefill_attention: the float64 forward).
#pragma once
// Included once, by attention.cu, inside its anonymous namespace.

constexpr int TK = 64;

template <int HD, int WARPS>
struct FlashSmem {  // rows padded by 16 bytes: ldmatrix's 8 rows of a matrix then hit distinct banks
    static constexpr int ld = HD + 8, rows = 16 * WARPS;
    static constexpr size_t q = 0, k = size_t(rows) * ld * 2, v = k + 2 * size_t(TK) * ld * 2,
                            bytes = v + 2 * size_t(TK) * ld * 2;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t*)&h;
}

template <int HD, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) attention_prefill_tc(AttnShape a, const float* __restrict__ q, int64_t ldq,
                                                                    const int32_t* __restrict__ pos,
                                                                    const __half* __restrict__ K,
                                                                    const __half* __restrict__ V,
                                                                    float* __restrict__ out, int64_t ldo_g, uint32_t* err) {
    using L = FlashSmem<HD, WARPS>;
    constexpr int TQ = L::rows, kTcThreads = WARPS * 32;
    extern __shared__ __align__(128) uint8_t smem[];
    __half* Qs = (__half*)(smem + L::q);
    __half* Ks = (__half*)(smem + L::k);
    __half* Vs = (__half*)(smem + L::v);
    __shared__ int tile_last;
    const int h = blockIdx.x, r0 = (gridDim.y - 1 - blockIdx.y) * TQ;  // the longest tiles start first
    const int dim = a.n_head_kv * HD, col0 = (h / (a.n_head / a.n_head_kv)) * HD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

    // This thread's two rows (g and g + 8 of the warp's 16): positions, -1 where there is no row.
    int p_row[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = r0 + warp * 16 + g + 8 * i;
        int p = r < a.rows ? pos[r] : -1;
        if (r < a.rows && (p < 0 || p >= a.n_ctx)) {
            atomicOr(err, kBadPosition);
            p = -1;
        }
        p_row[i] = p;
    }
    int w_first = min(p_row[0], p_row[1]), w_last = max(p_row[0], p_row[1]);  // a missing row (-1) masks all
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        w_first = min(w_first, __shfl_xor_sync(0xffffffffu, w_first, o));
        w_last = max(w_last, __shfl_xor_sync(0xffffffffu, w_last, o));
    }
    if (threadIdx.x == 0) tile_last = -1;
    for (int e = threadIdx.x; e < TQ * HD / 2; e += kTcThreads) {  // Q as f16, a pair a step
        const int i = e / (HD / 2), d = (e % (HD / 2)) * 2;
        const float* src = q + int64_t(r0 + i) * ldq + int64_t(h) * HD + d;
        *(uint32_t*)(Qs + i * L::ld + d) = r0 + i < a.rows ? pack_f16(src[0], src[1]) : 0u;
    }
    __syncthreads();
    if (lane == 0) atomicMax(&tile_last, w_last);
    __syncthreads();
    const int n_tiles = (tile_last + TK) / TK;  // 0 when no row of the tile is valid

    auto load_tile = [&](int tile, int stage) {
        const int j0 = tile * TK;
        for (int e = threadIdx.x; e < TK * HD / 8; e += kTcThreads) {
            const int j = e / (HD / 8), d = (e % (HD / 8)) * 8;
            const bool ok = j0 + j < a.n_ctx;  // zeros past the cache's end (never visible)
            const int64_t src = int64_t(ok ? j0 + j : 0) * dim + col0 + d;
            cp_async16(Ks + (stage * TK + j) * L::ld + d, K + src, ok);
            cp_async16(Vs + (stage * TK + j) * L::ld + d, V + src, ok);
        }
        cp_async_commit();
    };
    if (n_tiles > 0) load_tile(0, 0);

    // The warp's Q as mma A fragments, one per 16 columns of the head.
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) ldmatrix_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * L::ld + kk * 16 + (lane >> 4) * 8);

    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const float scale_log2 = a.scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)

    for (int tile = 0; tile < n_tiles; tile++) {
        const int stage = tile & 1, j0 = tile * TK;
        if (tile + 1 < n_tiles) {
            load_tile(tile + 1, stage ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j0 <= w_last) {  // the warp sees some key of this tile
            const __half* Kt = Ks + stage * TK * L::ld;
            const __half* Vt = Vs + stage * TK * L::ld;
            float s[TK / 8][4];
#pragma unroll
            for (int n = 0; n < TK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int n = 0; n < TK / 8; n += 2) {  // keys 8n..8n+15: b0, b1 of tile n, then of n + 1
                    uint32_t b[4];
                    ldmatrix_x4(b, Kt + (n * 8 + (lane >> 4) * 8 + (lane & 7)) * L::ld + kk * 16 + ((lane >> 3) & 1) * 8);
                    mma_f16(s[n], qf[kk], b[0], b[1]);
                    mma_f16(s[n + 1], qf[kk], b[2], b[3]);
                }
            }
            // Scores to log2 units, masked where the tile crosses a row's position.
            const bool masked = j0 + TK - 1 > w_first;
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < TK / 8; n++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int j = j0 + n * 8 + 2 * t + (c & 1), i = c >> 1;
                    const float v = masked && j > p_row[i] ? -INFINITY : s[n][c] * scale_log2;
                    s[n][c] = v;
                    mx[i] = fmaxf(mx[i], v);
                }
            }
            float corr[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                const float m_new = fmaxf(m_run[i], mx[i]);
                corr[i] = m_new == -INFINITY ? 1.0f : exp2f(m_run[i] - m_new);  // exp2(-inf) = 0 on the first tile
                m_run[i] = m_new;
            }
            // P = exp2(s - m), rounded to f16 as P V will weigh it; the sums add the rounded values.
            uint32_t pf[TK / 16][4];
            float sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < TK / 8; n++) {
                float e[4];
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float mr = m_run[c >> 1];
                    e[c] = s[n][c] == -INFINITY ? 0.0f : exp2f(s[n][c] - mr);
                }
                const uint32_t lo = pack_f16(e[0], e[1]), hi = pack_f16(e[2], e[3]);
                const float2 flo = __half22float2(*(const __half2*)&lo), fhi = __half22float2(*(const __half2*)&hi);
                sum[0] += flo.x + flo.y;
                sum[1] += fhi.x + fhi.y;
                // A fragment of keys 16(n/2)..: a0 row g, a1 row g+8 (first 8 keys); a2, a3 the next 8
                pf[n >> 1][(n & 1) * 2 + 0] = lo;
                pf[n >> 1][(n & 1) * 2 + 1] = hi;
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
                sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
                l_run[i] = l_run[i] * corr[i] + sum[i];
            }
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                o[n][0] *= corr[0], o[n][1] *= corr[0];
                o[n][2] *= corr[1], o[n][3] *= corr[1];
            }
            // O += P V: V rows are keys (k), columns head dims (n), read transposed into B fragments.
#pragma unroll
            for (int kk = 0; kk < TK / 16; kk++) {
#pragma unroll
                for (int n = 0; n < HD / 8; n += 2) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, Vt + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * L::ld + n * 8 + (lane >> 4) * 8);
                    mma_f16(o[n], pf[kk], b[0], b[1]);
                    mma_f16(o[n + 1], pf[kk], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // the stage is loaded again two tiles on
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = r0 + warp * 16 + g + 8 * i;
        if (r >= a.rows) continue;
        const float inv = l_run[i] > 0.0f ? 1.0f / l_run[i] : 0.0f;
        float* dst = out + int64_t(r) * ldo_g + int64_t(h) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2*)(dst + n * 8 + 2 * t) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
}
