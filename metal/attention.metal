// The KV store and causal GQA attention over the cache (f32, f16 or q8_0 rows of
// n_head_kv * head_dim values, one row per position; a local layer's window of
// positions, in a ring of rows where its cache is one: args.h), or over a batch
// step's pool of KV blocks (attention_paged; the store takes each token's pool row).
//
// attention: one threadgroup of 128 threads per (query head, row); the row's
// visible positions 0..pos are walked in chunks of 128 with an online
// softmax -- each thread scores one position, the chunk's max and sum are
// reduced over simdgroups then across them in threadgroup memory, and each
// thread accumulates output dims d = tid, tid + 128 over the chunk.
#include <metal_stdlib>
using namespace metal;
#include "args.h"
#include "kv_store.h"

// Value `col` of cache row j: f32 (kv_type 0), f16 (1) or q8_0 blocks of 32 (8: an f16 scale, 32 int8).
static inline float kv_at(device const uchar* kv, uint kv_type, uint j, uint dim, uint col) {
    if (kv_type == 1) return float(((device const half*)kv)[j * dim + col]);
    if (kv_type == 0) return ((device const float*)kv)[j * dim + col];
    device const uchar* blk = kv + (j * (dim / 32) + col / 32) * 34;
    return float(*(device const half*)blk) * float(((device const char*)(blk + 2))[col % 32]);
}

kernel void kv_store(constant KvStoreArgs& a [[buffer(0)]], device const float* k [[buffer(1)]],
                     device const float* v [[buffer(2)]], device const int* pos [[buffer(3)]],
                     device uchar* K [[buffer(4)]], device uchar* V [[buffer(5)]],
                     device atomic_uint* err [[buffer(6)]], uint2 gid [[thread_position_in_grid]]) {
    const uint i = gid.x, r = gid.y;
    const int p = pos[r];
    if (i < a.dim) {
        if (p < 0 || uint(p) >= a.n_ctx) {
            if (i == 0) atomic_fetch_or_explicit(err, 2u, memory_order_relaxed);
        } else if (a.kv_type == 8) {  // one thread per block of 32
            if (i % 32 == 0) {
                store_q8_0(k + r * a.k_ld + i, K + (kv_row(uint(p), a.ring) * (a.dim / 32) + i / 32) * 34);
                store_q8_0(v + r * a.v_ld + i, V + (kv_row(uint(p), a.ring) * (a.dim / 32) + i / 32) * 34);
            }
        } else {
            store_value(K, a.kv_type, kv_row(uint(p), a.ring), a.dim, i, k[r * a.k_ld + i]);
            store_value(V, a.kv_type, kv_row(uint(p), a.ring), a.dim, i, v[r * a.v_ld + i]);
        }
    }
}

// max (is_max) or sum over the threadgroup: simdgroups first, then their results in order.
static float tg_reduce(float v, bool is_max, threadgroup float* red, uint lane, uint sg, uint nsg) {
    v = is_max ? simd_max(v) : simd_sum(v);
    if (lane == 0) red[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = red[0];
    for (uint s = 1; s < nsg; s++) t = is_max ? max(t, red[s]) : t + red[s];
    threadgroup_barrier(mem_flags::mem_threadgroup);  // red[] is reused by the next reduction
    return t;
}

// Where position j's K/V row is: one sequence's cache (a local layer's ring), or a batch's pool through the row's
// block table (the host checked its entries; out-of-range ones are clamped so that no read leaves the pool).
struct RingRows {
    uint ring;
    uint operator()(uint j) const { return kv_row(j, ring); }
};
struct PagedRows {
    device const int* table;
    uint block_size, n_blocks;
    uint operator()(uint j) const {
        return uint(clamp(table[j / block_size], 0, int(n_blocks) - 1)) * block_size + j % block_size;
    }
};

// The online softmax of one (query head, row) over positions j0, j0 + 128 .. of chunks of 128 up to p, every
// `stride` positions a chunk: each thread scores one position, the chunk's max and sum are reduced over the
// threadgroup, and each thread accumulates output dims tid and tid + 128.  Returns (max, sum, o0, o1).
struct Online {
    float m, l, o0, o1;
};
template <typename Rows>
static Online attend(device const float* qh, device const uchar* K, device const uchar* V, uint kv_type, uint dim,
                     uint col0, uint hd, float scale, uint j_first, uint p, uint stride, Rows rows,
                     threadgroup float* s, threadgroup float* red, uint tid, uint lane, uint sg, uint nsg) {
    Online o = {-INFINITY, 0.0f, 0.0f, 0.0f};
    for (uint j0 = j_first; j0 <= p; j0 += stride) {
        const uint n = min(128u, p + 1 - j0);
        float sc = -INFINITY;
        if (tid < n) {
            const uint row = rows(j0 + tid);
            float dot = 0.0f;
            for (uint d = 0; d < hd; d++) dot += qh[d] * kv_at(K, kv_type, row, dim, col0 + d);
            sc = dot * scale;
        }
        const float cm = tg_reduce(sc, true, red, lane, sg, nsg);
        const float nm = max(o.m, cm), corr = exp(o.m - nm);
        const float e = tid < n ? exp(sc - nm) : 0.0f;
        s[tid] = e;
        const float cs = tg_reduce(e, false, red, lane, sg, nsg);  // its barriers publish s[] too
        o.l = o.l * corr + cs;
        o.m = nm;
        float acc0 = 0.0f, acc1 = 0.0f;
        for (uint jj = 0; jj < n; jj++) {
            const uint row = rows(j0 + jj);
            if (tid < hd) acc0 += s[jj] * kv_at(V, kv_type, row, dim, col0 + tid);
            if (tid + 128 < hd) acc1 += s[jj] * kv_at(V, kv_type, row, dim, col0 + tid + 128);
        }
        o.o0 = o.o0 * corr + acc0;
        o.o1 = o.o1 * corr + acc1;
        threadgroup_barrier(mem_flags::mem_threadgroup);  // s[] is rewritten by the next chunk
    }
    return o;
}

kernel void attention(constant AttnArgs& a [[buffer(0)]], device const float* q [[buffer(1)]],
                      device const int* pos [[buffer(2)]], device const uchar* K [[buffer(3)]],
                      device const uchar* V [[buffer(4)]], device float* out [[buffer(5)]],
                      threadgroup float* s [[threadgroup(0)]],      // 128 scores
                      threadgroup float* red [[threadgroup(1)]],    // one value per simdgroup
                      uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint nsg [[simdgroups_per_threadgroup]]) {
    const uint h = tg.x, r = tg.y, hd = a.head_dim, dim = a.n_head_kv * hd;
    const uint col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    const int p = clamp(pos[r], 0, int(a.n_ctx) - 1);  // the host checked positions; stay in bounds regardless
    const Online o = attend(q + r * a.q_ld + h * hd, K, V, a.kv_type, dim, col0, hd, a.scale, first_key(p, a.window),
                            uint(p), 128, RingRows{a.ring}, s, red, tid, lane, sg, nsg);
    if (tid < hd) out[r * a.o_ld + h * hd + tid] = o.o0 / o.l;
    if (tid + 128 < hd) out[r * a.o_ld + h * hd + tid + 128] = o.o1 / o.l;
}

// A batch step's attention over the paged pool: row r belongs to sequence seq[r], whose position j is in block
// tables[seq[r]][j / block_size]; one threadgroup per (query head, row) as `attention`, rows of any sequences.
kernel void attention_paged(constant PagedAttnArgs& a [[buffer(0)]], device const float* q [[buffer(1)]],
                            device const int* pos [[buffer(2)]], device const int* seq [[buffer(3)]],
                            device const int* tables [[buffer(4)]], device const uchar* K [[buffer(5)]],
                            device const uchar* V [[buffer(6)]], device float* out [[buffer(7)]],
                            threadgroup float* s [[threadgroup(0)]], threadgroup float* red [[threadgroup(1)]],
                            uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                            uint nsg [[simdgroups_per_threadgroup]]) {
    const uint h = tg.x, r = tg.y, hd = a.head_dim, dim = a.n_head_kv * hd;
    const uint col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    const int p = clamp(pos[r], 0, int(a.max_blocks * a.block_size) - 1);  // (the host checked; stay in bounds)
    const uint sq = uint(clamp(seq[r], 0, int(a.n_seqs) - 1));
    const PagedRows rows = {tables + sq * a.max_blocks, a.block_size, a.n_blocks};
    const Online o = attend(q + r * a.q_ld + h * hd, K, V, a.kv_type, dim, col0, hd, a.scale, first_key(p, a.window),
                            uint(p), 128, rows, s, red, tid, lane, sg, nsg);
    if (tid < hd) out[r * a.o_ld + h * hd + tid] = o.o0 / o.l;
    if (tid + 128 < hd) out[r * a.o_ld + h * hd + tid + 128] = o.o1 / o.l;
}

// The KV-split variant for decode (flash decoding): gridDim.z = S blocks share
// one (head, row), block z walking chunks z, z + S, ... of the visible
// positions with the same online softmax, and writing its partial
// (max, sum, unnormalized output) to `partial`; attention_combine merges the S
// partials.  S depends only on n_ctx, so the encoded work of a decode step does
// not change as the cache fills; a block with nothing to do writes an empty partial.
kernel void attention_split(constant AttnArgs& a [[buffer(0)]], device const float* q [[buffer(1)]],
                            device const int* pos [[buffer(2)]], device const uchar* K [[buffer(3)]],
                            device const uchar* V [[buffer(4)]], device float* partial [[buffer(5)]],
                            threadgroup float* s [[threadgroup(0)]], threadgroup float* red [[threadgroup(1)]],
                            uint3 tg [[threadgroup_position_in_grid]], uint3 ngrid [[threadgroups_per_grid]],
                            uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                            uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    const uint h = tg.x, r = tg.y, z = tg.z, S = ngrid.z, hd = a.head_dim, dim = a.n_head_kv * hd;
    const uint col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    const int p = clamp(pos[r], 0, int(a.n_ctx) - 1);
    const Online o = attend(q + r * a.q_ld + h * hd, K, V, a.kv_type, dim, col0, hd, a.scale,
                            first_key(p, a.window) + z * 128, uint(p), S * 128, RingRows{a.ring}, s, red, tid, lane,
                            sg, nsg);
    device float* part = partial + ((r * a.n_head + h) * S + z) * (hd + 2);
    if (tid == 0) {
        part[0] = o.m;
        part[1] = o.l;
    }
    if (tid < hd) part[2 + tid] = o.o0;
    if (tid + 128 < hd) part[2 + tid + 128] = o.o1;
}

// out = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z over the S partials of each (head, row).
kernel void attention_combine(constant AttnArgs& a [[buffer(0)]], device const float* partial [[buffer(1)]],
                              device float* out [[buffer(2)]], uint2 tg [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]], uint ntg [[threads_per_threadgroup]]) {
    const uint h = tg.x, r = tg.y, hd = a.head_dim, S = a.splits;
    device const float* base = partial + (r * a.n_head + h) * S * (hd + 2);
    float M = -INFINITY;
    for (uint z = 0; z < S; z++) M = max(M, base[z * (hd + 2)]);
    float L = 0.0f;
    for (uint z = 0; z < S; z++)
        if (base[z * (hd + 2)] > -INFINITY) L += exp(base[z * (hd + 2)] - M) * base[z * (hd + 2) + 1];
    for (uint d = tid; d < hd; d += ntg) {
        float acc = 0.0f;
        for (uint z = 0; z < S; z++)
            if (base[z * (hd + 2)] > -INFINITY) acc += exp(base[z * (hd + 2)] - M) * base[z * (hd + 2) + 2 + d];
        out[r * a.o_ld + h * hd + d] = L > 0.0f ? acc / L : 0.0f;
    }
}
