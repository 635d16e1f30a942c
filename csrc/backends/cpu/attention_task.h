// One unit of cpu_attention's work, shared by its kernels: a KV head's keys and values against some of
// its query heads for a block of query rows of one sequence.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backends/cpu/attention.h"

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
};

// s[j] <- exp(s[j] - max s) over j < nk; returns 1 / their sum.
float softmax_unnormalized(float* s, int nk);

// Attention in f32 on register tiles (attention_tiles.inc), built for AVX-512 and AVX2 on x86-64, NEON on ARM.
void tiles_attention_task_avx512(const AttnTask& t);
void tiles_attention_task_avx2(const AttnTask& t);
void tiles_attention_task_neon(const AttnTask& t);

}  // namespace minfer
