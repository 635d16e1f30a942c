// Argument structs of the Metal kernels: bound at [[buffer(0)]] by the host
// (csrc/backends/metal, Objective-C++) and by the emulator's tests, so both
// sides agree on one layout (4-byte fields only: no padding questions).
#pragma once
#ifndef __METAL_VERSION__
#if !defined(MSL_EMULATOR)
#include <cstdint>
typedef uint32_t uint;
#endif
#endif

struct NormArgs {     // RmsNorm (width = cols) and QkNorm (width = head_dim)
    uint width, x_ld, y_ld;
    float eps;
};

struct AddNormArgs {  // AddRmsNorm: y[:, :width] = a + b, y[:, width:] = RmsNorm(a + b)
    uint width, a_ld, b_ld, y_ld;
    float eps;
};

enum EwOp { EW_ADD = 0, EW_MUL = 1, EW_SILU = 2, EW_SWIGLU = 3, EW_COPY = 4, EW_GELU = 5, EW_GEGLU = 6, EW_SCALE = 7,
            EW_SOFTCAP = 8 };
struct EwArgs {
    uint cols, a_ld, b_ld, y_ld, op;
    float scale;  // EW_SCALE's factor, EW_SOFTCAP's cap
};

struct RopeArgs {     // freq[i] = base^(-2i / rope_dim), computed by the host in double
    uint cols, head_dim, rope_dim, x_ld, y_ld, neox;
};

// The single-token and small-batch tiers: y[r, o] = x[r, :K] . W[o, :K] (+ bias[o]) for o < N, over up
// to three weight parts of one type bound as one buffer (a fused q|k|v projection: output columns
// [0, end0) from part 0, [end0, end1) from part 1, [end1, N) from part 2, each part's rows at its byte
// offset from the bound buffer).  swiglu: y[r, o] = silu(part 0 row o) * (part 1 row o) (the fused gate/up).
struct MatvecArgs {
    uint K, N, row_bytes, x_ld, y_ld, n_rows;
    uint end0, end1;        // the parts' column ranges (end0 = end1 = N: one part)
    uint w_off0, w_off1, w_off2;  // byte offsets of the parts' rows in the weight buffer
    uint has_bias;          // 1: add the bias buffer's values, part p's at float offset b_off[p]
    uint b_off0, b_off1, b_off2;
    uint swiglu;
};

struct MatmulArgs {   // y[m, n] = x[m, :K] . W[n, :K] for m < M, n < N (the simdgroup-matrix tier)
    uint K, N, M, row_bytes, x_ld, y_ld;
};

struct GetRowsArgs {
    uint K, row_bytes, n_rows_w, y_ld;
};

struct KvStoreArgs {  // KV rows of `dim` values at the rows' positions; kv_type: ggml's id (F32 0, F16 1, Q8_0 8)
    uint dim, n_ctx, k_ld, v_ld, kv_type;
    uint ring;        // > 0: the cache is a ring of this many rows, position p in row p % ring (a local layer)
};

// The cache row of position p: p itself, or its row in a local layer's ring.
static inline uint kv_row(uint p, uint ring) { return ring > 0 ? p % ring : p; }

struct RopeStoreArgs { // rope_kv_store: rope(q) -> y; rope(k) and v stored at the row's position
    uint q_cols, kv_dim, head_dim, rope_dim, neox, q_ld, k_ld, v_ld, y_ld, n_ctx, kv_type;
    uint ring;        // as KvStoreArgs
    uint paged;       // 1: a batch step's, each row stored at its pool row (the rows buffer), not its position's
};

struct AttnArgs {     // causal GQA attention of q rows over the cache, kv_type as above
    uint n_head, n_head_kv, head_dim, n_ctx, q_ld, o_ld, kv_type;
    float scale;
    uint splits;      // attention_split / attention_combine: the number of KV splits
    uint rows_q;      // attention_prefill: the number of query rows
    uint window;      // > 0: a query at position p sees keys p - window < j <= p (gemma's local layers)
    uint ring;        // as KvStoreArgs
};

struct PagedAttnArgs {  // attention_paged: a batch step's rows over a pool of KV blocks (kv_type as above)
    uint n_head, n_head_kv, head_dim, q_ld, o_ld, kv_type;
    float scale;
    uint window;      // as AttnArgs
    uint block_size;  // rows a block
    uint n_blocks;    // blocks in the pool
    uint max_blocks;  // entries of a sequence's block table
    uint n_seqs;      // sequences of the step (rows of the tables)
};

// The first key a query at position p sees.
static inline uint first_key(int p, uint window) { return window > 0 && uint(p) >= window ? uint(p) - window + 1 : 0; }
