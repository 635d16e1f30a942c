// KV-cache store and causal grouped-query attention on the CPU.
//
// The cache of one layer is two regions of n_ctx rows (one per position), each
// row the kv_dim = n_head_kv * head_dim values of that position in kv_type.
#pragma once
#include <cstdint>

#include "quant/quant.h"
#include "runtime/thread_pool.h"

namespace minfer {

struct KvLayout {
    uint32_t type;     // F32, F16 or Q8_0
    int64_t dim;       // n_head_kv * head_dim
    int n_ctx;
};

// Rows r of k and v go to cache row pos[r].
void cpu_kv_store(const float* k, int64_t k_ld, const float* v, int64_t v_ld, int64_t rows, const int32_t* pos,
                  uint8_t* k_cache, uint8_t* v_cache, const KvLayout& kv);

// out[r, h] = softmax_j(q[r, h] . K[j, g] * scale) V[j, g] over j = 0..pos[r],
// g = h / (n_head / n_head_kv).
void cpu_attention(const float* q, int64_t q_ld, float* out, int64_t out_ld, int64_t rows, const int32_t* pos,
                   const uint8_t* k_cache, const uint8_t* v_cache, const KvLayout& kv, int n_head, int n_head_kv,
                   int head_dim, float scale, ThreadPool& pool);

}  // namespace minfer
