// One unit of cpu_attention's work, shared by its kernels: a KV head's keys and values against some of
// its query heads for a block of query rows of one sequence.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backends/cpu/attention.h"
#include "backends/kv_format.h"

namespace minfer {

struct AttnTask {
    const float* q;
    int64_t q_ld;
    float* out;
    int64_t out_ld;
    int64_t r0, r1;        // query rows
    const int32_t* pos;    // per row: its position (the last key it sees)
    int window;            // > 0: a row sees its last `window` keys only
    int g, h0, h1;         // the KV head and its query heads [h0, h1)
    int head_dim;
    float scale;
    const uint8_t* k_cache;
    const uint8_t* v_cache;
    size_t row_bytes;      // one cache row: every KV head
    size_t head_bytes;     // one KV head's slice of a cache row
    const KvLayout* kv;
    const int32_t* table;  // null: one sequence, key j in kv->row(j); else its block table
    int block_size;
    int k_lo, n_keys;      // the keys any row of the task sees: [k_lo, n_keys)

    int first_key(int64_t r) const { return window > 0 ? std::max(0, pos[r] - window + 1) : 0; }
    // key j's K (or V) values for this task's KV head
    const uint8_t* key(const uint8_t* cache, int j) const {
        const size_t row = table ? size_t(table[j / block_size]) * size_t(block_size) + size_t(j % block_size) : kv->row(j);
        return cache + row * row_bytes;
    }
    // Key j's K (or V) values in f32, with key j + ahead's (if the task reads it) asked into L2 (prefetcht1).
    // The KV head's slice of a cache row is a few cache lines out of every row, a strided walk the hardware
    // prefetchers follow poorly; into L2, since a core has few L1 miss slots and prefetches into L1 held them
    // and stalled the conversion's own loads (a cold 295 KB walk with a chunk's work between chunks: 67 us
    // without prefetch, 56 into L1, 45 into L2).
    void read_row(const uint8_t* cache, int j, int ahead, float* out) const {
        const size_t slice0 = size_t(g) * head_bytes;
        if (j + ahead < n_keys)
            for (size_t b = 0; b < head_bytes; b += 64) __builtin_prefetch(key(cache, j + ahead) + slice0 + b, 0, 2);
        if (kv->type == GGML_TYPE_F16) kv_read_f16(key(cache, j), int64_t(g) * head_dim, out, head_dim);
        else kv_read_row(kv->type, key(cache, j), int64_t(g) * head_dim, out, head_dim);
    }
};

// s[j] <- exp(s[j] - max s) over j < nk; returns 1 / their sum.
float softmax_unnormalized(float* s, int nk);

// Attention in f32 on register tiles (attention_tiles.inc), built for AVX-512 and AVX2 on x86-64, NEON on ARM.
void tiles_attention_task_avx512(const AttnTask& t);
void tiles_attention_task_avx2(const AttnTask& t);
void tiles_attention_task_neon(const AttnTask& t);

}  // namespace minfer
