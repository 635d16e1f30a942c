// Prefill attention on simdgroup matrices: a threadgroup (4 simdgroups) takes
// 8 query rows of one head and walks the visible keys in tiles of 16 --
// S = Q K^T as 8 x 8 blocks, a masked online softmax per row (16 threads per
// row, reduced with shuffles), O += P V with O kept in threadgroup memory so
// each row can be rescaled.  Everything in f32 (so it rounds like the
// one-row kernel), which keeps threadgroup memory at 24.5 KB for head_dim 128,
// under Apple's 32 KB.
#include <metal_stdlib>
using namespace metal;
#include "args.h"

constant constexpr uint TQ = 8, TK = 16;

kernel void attention_prefill(constant AttnArgs& a [[buffer(0)]], device const float* q [[buffer(1)]],
                              device const int* pos [[buffer(2)]], device const half* K [[buffer(3)]],
                              device const half* V [[buffer(4)]], device float* out [[buffer(5)]],
                              threadgroup float* qs [[threadgroup(0)]],    // TQ x hd
                              threadgroup float* ks [[threadgroup(1)]],    // TK x hd
                              threadgroup float* vs [[threadgroup(2)]],    // TK x hd
                              threadgroup float* ss [[threadgroup(3)]],    // TQ x TK: scores, then weights
                              threadgroup float* os [[threadgroup(4)]],    // TQ x hd
                              threadgroup float* stat [[threadgroup(5)]],  // m, l, corr: 3 x TQ
                              uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                              uint sg [[simdgroup_index_in_threadgroup]]) {
    const uint h = tg.x, r0 = tg.y * TQ, hd = a.head_dim, dim = a.n_head_kv * hd;
    const uint col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    threadgroup float* m_row = stat;
    threadgroup float* l_row = stat + TQ;
    threadgroup float* corr_row = stat + 2 * TQ;
    int last = -1, lo = int(a.n_ctx);  // the tile's keys: from its first row's first key to its last position
    for (uint i = 0; i < TQ; i++)
        if (r0 + i < a.rows_q) {
            const int p = min(pos[r0 + i], int(a.n_ctx) - 1);
            last = max(last, p);
            lo = min(lo, int(first_key(max(p, 0), a.window)));
        }
    for (uint e = tid; e < TQ * hd; e += 128) {
        const uint i = e / hd, d = e % hd;
        qs[e] = r0 + i < a.rows_q ? q[(r0 + i) * a.q_ld + h * hd + d] : 0.0f;
        os[e] = 0.0f;
    }
    if (tid < TQ) m_row[tid] = -INFINITY, l_row[tid] = 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (uint j0 = uint(lo) / TK * TK; int(j0) <= last; j0 += TK) {
        for (uint e = tid; e < TK * hd; e += 128) {
            const uint j = e / hd, d = e % hd;
            const bool in = j0 + j < a.n_ctx;
            ks[e] = in ? float(K[kv_row(j0 + j, a.ring) * dim + col0 + d]) : 0.0f;
            vs[e] = in ? float(V[kv_row(j0 + j, a.ring) * dim + col0 + d]) : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (sg < TK / 8) {  // S: 1 x 2 blocks of 8 x 8, one per simdgroup 0 and 1
            simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
            for (uint k = 0; k < hd; k += 8) {
                simdgroup_float8x8 fa, fb;
                simdgroup_load(fa, qs, hd, ulong2(k, 0));
                simdgroup_load(fb, ks, hd, ulong2(k, sg * 8), true);  // K^T
                simdgroup_multiply_accumulate(acc, fa, fb, acc);
            }
            simdgroup_store(acc, ss, TK, ulong2(sg * 8, 0));
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        {  // online softmax: thread tid takes row tid / 16, column tid % 16
            const uint i = tid / TK, c = tid % TK;
            const int p = r0 + i < a.rows_q ? pos[r0 + i] : -1;
            const bool seen = int(j0 + c) <= p && j0 + c >= first_key(max(p, 0), a.window);
            const float sv = seen ? ss[i * TK + c] * a.scale : -INFINITY;
            float mx = sv;
            for (ushort o = 1; o < TK; o *= 2) mx = max(mx, simd_shuffle_xor(mx, o));
            const float m_old = m_row[i], m_new = max(m_old, mx);
            const float e = sv == -INFINITY ? 0.0f : exp(sv - m_new);
            float sum = e;
            for (ushort o = 1; o < TK; o *= 2) sum += simd_shuffle_xor(sum, o);
            threadgroup_barrier(mem_flags::mem_threadgroup);  // every thread has read m_row and ss
            ss[i * TK + c] = e;
            if (c == 0) {
                const float corr = m_new == -INFINITY ? 1.0f : exp(m_old - m_new);
                corr_row[i] = corr;
                l_row[i] = l_row[i] * corr + sum;
                m_row[i] = m_new;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint e = tid; e < TQ * hd; e += 128) os[e] *= corr_row[e / hd];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint bn = sg; bn < hd / 8; bn += 4) {  // O += P V: hd / 8 blocks, every 4th per simdgroup
            simdgroup_float8x8 acc;
            simdgroup_load(acc, os, hd, ulong2(bn * 8, 0));
            for (uint k = 0; k < TK; k += 8) {
                simdgroup_float8x8 fa, fb;
                simdgroup_load(fa, ss, TK, ulong2(k, 0));
                simdgroup_load(fb, vs, hd, ulong2(bn * 8, k));
                simdgroup_multiply_accumulate(acc, fa, fb, acc);
            }
            simdgroup_store(acc, os, hd, ulong2(bn * 8, 0));
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // K/V tiles are reloaded next
    }
    for (uint e = tid; e < TQ * hd; e += 128) {
        const uint i = e / hd, d = e % hd;
        if (r0 + i < a.rows_q && l_row[i] > 0.0f) out[(r0 + i) * a.o_ld + h * hd + d] = os[e] / l_row[i];
    }
}
