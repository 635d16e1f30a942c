// The decode fusion of RoPE and the KV store: one threadgroup per row rotates
// q into y and k into threadgroup memory (a q8_0 block needs all 32 of its
// rotated values), then stores k and v at the row's position (a batch step:
// at its pool row, rows[r]).  The same arithmetic as rope + kv_store (rope.h,
// kv_store.h), so the results are identical; a row outside the cache sets bit 2
// of the error word and stores nothing.
#include <metal_stdlib>
using namespace metal;
#include "args.h"
#include "kv_store.h"
#include "rope.h"

kernel void rope_kv_store(constant RopeStoreArgs& a [[buffer(0)]], device const float* q [[buffer(1)]],
                          device const float* k [[buffer(2)]], device const float* v [[buffer(3)]],
                          device const int* pos [[buffer(4)]], device const float* freq [[buffer(5)]],
                          device float* y [[buffer(6)]], device uchar* K [[buffer(7)]], device uchar* V [[buffer(8)]],
                          device atomic_uint* err [[buffer(9)]], device const int* rows [[buffer(10)]],
                          threadgroup float* kr [[threadgroup(0)]],  // the rotated k row (kv_dim values)
                          uint r [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                          uint ntg [[threads_per_threadgroup]]) {
    const int p = pos[r], at = a.paged ? rows[r] : p;
    const bool ok = p >= 0 && at >= 0 && uint(at) < a.n_ctx;
    const uint row = a.paged ? uint(at) : kv_row(uint(at), a.ring);
    if (!ok && tid == 0) atomic_fetch_or_explicit(err, 2u, memory_order_relaxed);
    const uint pairs = a.head_dim / 2, q_pairs = a.q_cols / 2;
    for (uint t = tid; t < q_pairs + a.kv_dim / 2; t += ntg) {
        if (t < q_pairs) {
            const uint h = t / pairs;
            rope_pair(q + r * a.q_ld + h * a.head_dim, y + r * a.y_ld + h * a.head_dim, t % pairs, a.rope_dim, a.neox,
                      p, freq);
        } else {
            const uint u = t - q_pairs, h = u / pairs;
            rope_pair(k + r * a.k_ld + h * a.head_dim, kr + h * a.head_dim, u % pairs, a.rope_dim, a.neox, p, freq);
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    device const float* vr = v + r * a.v_ld;
    if (ok && a.kv_type == 8) {
        for (uint b = tid; b < a.kv_dim / 32; b += ntg) {
            store_q8_0(kr + b * 32, K + (row * (a.kv_dim / 32) + b) * 34);
            store_q8_0(vr + b * 32, V + (row * (a.kv_dim / 32) + b) * 34);
        }
    } else if (ok) {
        for (uint i = tid; i < a.kv_dim; i += ntg) {
            store_value(K, a.kv_type, row, a.kv_dim, i, kr[i]);
            store_value(V, a.kv_type, row, a.kv_dim, i, vr[i]);
        }
    }
}
