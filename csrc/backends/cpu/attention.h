// KV-cache store and causal grouped-query attention on the CPU.
//
// The cache of one layer is two regions of n_ctx rows, each row the kv_dim = n_head_kv * head_dim values of
// one token in kv_type.  One sequence: row = position.  A batch: the regions are a pool of blocks of
// block_size rows, and position j of a row's sequence is in block tables[seq][j / block_size].
#pragma once
#include <cstdint>

#include "quant/quant.h"
#include "runtime/thread_pool.h"

namespace minfer {

struct KvLayout {
    uint32_t type;     // F32, F16 or Q8_0
    int64_t dim;       // n_head_kv * head_dim
    int n_ctx;
    int ring = 0;      // > 0: the cache is a ring of this many rows, position p in row p % ring (a local layer)
    size_t row(int p) const { return size_t(ring > 0 ? p % ring : p); }
};

// A batch step's view of the pool (see KvLayout): rows sequence by sequence.
struct KvPages {
    const int32_t* seq;     // per query row: its sequence (a row of tables)
    const int32_t* tables;  // [n_seqs, max_blocks] block ids
    int n_seqs, max_blocks, block_size;
};

// Rows r of k and v go to cache row pos[r] (a batch: the token's pool row).
void cpu_kv_store(const float* k, int64_t k_ld, const float* v, int64_t v_ld, int64_t rows, const int32_t* pos,
                  uint8_t* k_cache, uint8_t* v_cache, const KvLayout& kv);

// out[r, h] = softmax_j(q[r, h] . K[j, g] * scale) V[j, g] over j = 0..pos[r] (window > 0: over
// j = pos[r] - window + 1..pos[r]), g = h / (n_head / n_head_kv); pages: null for one sequence, else K/V row j of row r's sequence is found
// through its block table.
void cpu_attention(const float* q, int64_t q_ld, float* out, int64_t out_ld, int64_t rows, const int32_t* pos,
                   const uint8_t* k_cache, const uint8_t* v_cache, const KvLayout& kv, int n_head, int n_head_kv,
                   int head_dim, float scale, int window, ThreadPool& pool, Isa isa, const KvPages* pages = nullptr);

// The kernel cpu_attention's rule picks for a cache type and head size on this CPU with the kernels of `isa`:
// "tiles" (f32 on register tiles, 16 lanes on the avx512 tier, 8 on avx2, 4 on neon: heads of a multiple of the
// width up to 256) or "f32" (portable loops a (row, head) at a time); cpu.attention forces one.
const char* cpu_attention_kernel(uint32_t kv_type, int head_dim, Isa isa);

}  // namespace minfer
