// Prefill attention on the tensor cores (f16 cache, head_dim 64 or 128): a block takes 64 query rows of one
// head and walks the visible positions in tiles of 64 with an online softmax.  Reference: tests/test_cuda.py
// (test_kvstore_attention against the reference backend, with the f16 bound).
#pragma once
// Included once, by attention.cu, inside its anonymous namespace (one translation unit: the constants and
// helpers there, and the same code as when it was one file).

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
