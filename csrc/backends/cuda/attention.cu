// Causal GQA attention over the KV cache, flash-style: each block owns one
// (query head, row) and walks the row's visible positions in chunks of 128
// with an online softmax (running max, running sum, rescaled output).
//
// Decode (one row) splits the KV length over gridDim.z blocks whose partials
// a combine kernel merges (flash decoding); the split count depends only on
// n_ctx, so a captured decode graph stays valid as the cache fills: blocks
// whose chunks lie past the row's position write an empty partial.  Over an
// f16 cache a KV head's 2-8 query heads are one block on the tensor cores
// (attention_decode_tc.cuh: each K/V row read once a KV head); otherwise a
// block per query head, whose splits can instead be one thread-block cluster
// that merges them in distributed shared memory (attention_decode_f16_cl; the
// rule is cluster_merge_splits).  The general kernel's prefill rows use one
// block each (there are rows x heads blocks already).
//
// Prefill over an f16 cache (the default) runs on the tensor cores instead
// (attention_prefill.cuh): 64 query rows of one head a block, scores,
// probabilities and output in registers, keys in tiles of 64.
//
// Positions are read on the device, never from the host: the same launch
// serves every step.  Reference: the reference backend's attention; tests/test_cuda_attention.py
// (test_kvstore_attention, test_decode_attention_*).
#include "backends/cuda/common.cuh"
#include "backends/kernel_choice.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/matvec_rows.cuh"
#include "backends/cuda/mma_act.cuh"
#include "quant/types.h"

namespace minfer::cuda {

namespace {

constexpr int kChunk = 128, kThreads = 128, kMaxHeadDim = 256;
constexpr int kClusterSplits = 8;  // blocks a cluster of the decode merge (the portable cluster size)
// Prefill's warps a block (16 query rows each): 8 warps (128 rows, K/V tiles read once for twice the rows)
// measured no faster at 16k-32k positions, and slower on the 1.5B and 7B layouts.
constexpr int kPrefillWarps = 4;
constexpr int kTcMinContext = 8192;  // one sequence's decode: the tensor-core kernel above this n_ctx

__device__ __forceinline__ float kv_at(uint32_t kv_type, const uint8_t* base, int64_t j, int dim, int col) {
    if (kv_type == GGML_TYPE_F16) return __half2float(((const __half*)base)[j * dim + col]);
    if (kv_type == GGML_TYPE_F32) return ((const float*)base)[j * dim + col];
    const uint8_t* blk = base + j * int64_t(dim / 32) * 34 + (col / 32) * 34;  // q8_0
    return f16_at(blk) * float(((const int8_t*)blk)[2 + col % 32]);
}

// Values col..col+7 of cache row j (col a multiple of 8): one 16-byte load for f16.
__device__ __forceinline__ void kv_load8(uint32_t kv_type, const uint8_t* base, int64_t j, int dim, int col, float* y) {
    if (kv_type == GGML_TYPE_F16) {
        const uint4 v = *(const uint4*)((const __half*)base + j * dim + col);
        const __half2* h = (const __half2*)&v;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(h[i]);
            y[2 * i] = f.x;
            y[2 * i + 1] = f.y;
        }
    } else if (kv_type == GGML_TYPE_F32) {
        const float4* p = (const float4*)((const float*)base + j * dim + col);
        const float4 u = p[0], v = p[1];
        y[0] = u.x, y[1] = u.y, y[2] = u.z, y[3] = u.w, y[4] = v.x, y[5] = v.y, y[6] = v.z, y[7] = v.w;
    } else {
        const uint8_t* blk = base + j * int64_t(dim / 32) * 34 + (col / 32) * 34;
        const float d = f16_at(blk);
        const int8_t* q = (const int8_t*)blk + 2 + col % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = d * float(q[i]);
    }
}

#include "backends/cuda/attention_split.cuh"
#include "backends/cuda/attention_decode.cuh"
#include "backends/cuda/attention_prefill.cuh"
#include "backends/cuda/attention_decode_tc.cuh"

}  // namespace

static void check_heads(const AttnShape& a) {
    if (a.head_dim > kMaxHeadDim || a.n_head_kv <= 0 || a.n_head % a.n_head_kv)
        throw MinferError(strfmt("CUDA attention: head_dim %d (at most %d), %d heads over %d KV heads", a.head_dim,
                                 kMaxHeadDim, a.n_head, a.n_head_kv));
}

static void check_splits(const AttnShape& a, int S) {
    if (size_t(S) * sizeof(float) > 48 * 1024)  // the combine's weights live in shared memory
        throw MinferError(strfmt("CUDA attention: a context of %d positions (at most %d)", a.n_ctx, 12288 * kChunk));
}

// Decode over an f16 cache takes the tensor-core group kernel where a KV head has 2-8 query heads, else the
// warp kernels (a block per query head); the kernel choice cuda.attention forces the warp kernels or the
// general one (tests compare them).
bool decode_f16_kernel_on() { return forced_kernel("cuda.attention") != "general"; }

static bool decode_tc_on(const AttnShape& a) {
    const int G = a.n_head / a.n_head_kv;
    return a.kv_type == GGML_TYPE_F16 && (a.head_dim == 64 || a.head_dim == 128) && a.window == 0 && G >= 2 &&
           G <= kTcGroup && forced_kernel("cuda.attention").empty();
}

template <typename... Args>
static void launch_decode_tc(const AttnShape& a, dim3 grid, cudaStream_t s, Args... args) {
    launch("attention_decode_tc", a.head_dim == 64 ? attention_decode_tc<64> : attention_decode_tc<128>, grid,
           dim3(kThreads), 0, s, a, args...);
}

// The blocks a head of the cluster merge (attention_decode_f16_cl), or 0 for the split grid and the combine.
// The cluster merge takes decode where each of its blocks walks one chunk (S <= 8: the split grid's
// parallelism without the combine launch) or where its n_head x 8 blocks fill the GPU.  With fewer heads and
// more than 8 splits, each cluster block walks several chunks and the split grid's wider parallelism measured
// faster at long contexts.  The kernel choice cuda.attention_merge forces one (tests).
int cluster_merge_splits(const AttnShape& a, int S) {
    const std::string v = forced_kernel("cuda.attention_merge");
    const int C = std::min(S, kClusterSplits);
    if (v == "cluster") return C;
    if (v == "combine") return 0;
    const int sms = sm_count();
    return S <= kClusterSplits || int64_t(a.n_head) * C >= sms ? C : 0;
}

template <int HD>
static void launch_prefill(const AttnShape& a, const float* q, int64_t ldq, const int32_t* pos, const void* K, const void* V,
                    float* out, int64_t ldo, uint32_t* err, cudaStream_t s) {
    using L = FlashSmem<HD, kPrefillWarps>;
    static bool raised = false;  // the opt-in above 48 KB of shared memory, once per process and kernel
    if (!raised) {
        const cudaError_t e = cudaFuncSetAttribute(attention_prefill_tc<HD, kPrefillWarps>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, int(L::bytes));
        if (e != cudaSuccess) throw MinferError(strfmt("CUDA attention: %s", cudaGetErrorString(e)));
        raised = true;
    }
    const dim3 grid(unsigned(a.n_head), unsigned((a.rows + L::rows - 1) / L::rows));
    attention_prefill_tc<HD, kPrefillWarps><<<grid, kPrefillWarps * 32, L::bytes, s>>>(
        a, q, ldq, pos, (const __half*)K, (const __half*)V, out, ldo, err);
    check_launch("attention_prefill_tc");
}

bool attention_uses_tensor_cores(const AttnShape& a) {
    return a.rows >= 16 && a.kv_type == GGML_TYPE_F16 && (a.head_dim == 64 || a.head_dim == 128) && a.window == 0;
}

// The tensor-core decode's splits: a chunk of 128 positions each up to the cache's size, at most what keeps two
// blocks an SM busy (rows x KV heads x splits), so that at long contexts each block walks several chunks and
// overlaps their loads; a batch of many rows has one split (no combine).  Depends on the shape only: a
// captured graph serves every position.
static int decode_tc_splits(const AttnShape& a) {
    const int64_t steps = (a.n_ctx + kChunk - 1) / kChunk;
    const int64_t fill = std::max<int64_t>(1, 2 * int64_t(sm_count()) / (int64_t(a.rows) * a.n_head_kv));
    return int(std::min(steps, fill));
}

// One sequence's decode takes the tensor-core kernel in caches of more than 8,192 positions: it streams a deep
// context at 1.5-1.8x the warp kernels' rate, but with a block per KV head it has fewer blocks than they do at
// shallow depths (6-9 % slower at depth 512); the split count, and so the kernel, follows n_ctx.
static bool one_row_tc(const AttnShape& a) { return a.rows == 1 && a.n_ctx > kTcMinContext && decode_tc_on(a); }

int attention_splits(const AttnShape& a) {
    if (attention_uses_tensor_cores(a) || a.rows != 1) return 1;
    return one_row_tc(a) ? decode_tc_splits(a) : (a.n_ctx + kChunk - 1) / kChunk;
}

static void launch_combine(const AttnShape& a, int S, const int32_t* pos, const float* scratch, float* out,
                           int64_t ldo, Q8Act q8, cudaStream_t s, MmaAct xb = {}) {
    launch("attention_combine", attention_combine_kernel, dim3(unsigned(a.n_head), unsigned(a.rows)), dim3(128),
           size_t(S) * sizeof(float), s, a, S, pos, scratch, out, ldo, q8, xb);
}

size_t attention_scratch_floats(const AttnShape& a) {
    const int S = attention_splits(a);
    return S > 1 ? size_t(a.rows) * size_t(a.n_head) * size_t(S) * size_t(a.head_dim + 2) : 0;
}

void attention(const AttnShape& a, const float* q, int64_t ldq, const int32_t* pos, const void* K, const void* V,
               float* out, int64_t ldo, float* scratch, uint32_t* err, Q8Act q8, cudaStream_t s) {
    if (q8.q && a.head_dim % 32)
        throw MinferError(strfmt("CUDA attention: 8-bit output needs head_dim %% 32 == 0, got %d", a.head_dim));
    check_heads(a);
    if (attention_uses_tensor_cores(a)) {
        if (a.head_dim == 64) launch_prefill<64>(a, q, ldq, pos, K, V, out, ldo, err, s);
        else launch_prefill<128>(a, q, ldq, pos, K, V, out, ldo, err, s);
        return;
    }
    const int S = attention_splits(a);
    check_splits(a, S);
    const bool fast = a.rows == 1 && a.kv_type == GGML_TYPE_F16 && (a.head_dim == 64 || a.head_dim == 128) && a.window == 0;
    const bool tc = one_row_tc(a);
    const unsigned C = !tc && fast && decode_f16_kernel_on() && S > 1 ? unsigned(cluster_merge_splits(a, S)) : 0u;
    if (tc) {
        launch_decode_tc(a, dim3(unsigned(a.n_head_kv), 1u, unsigned(S)), s, q, pos, (const __half*)K,
                         (const __half*)V, out, scratch, err, KvPages{}, int64_t(0), int64_t(0), MmaAct{});
    } else if (C) {  // one cluster of C splits a head, merging in distributed shared memory
        launch_in_clusters("attention_decode_cl", a.head_dim == 64 ? attention_decode_f16_cl<64> : attention_decode_f16_cl<128>,
                           dim3(unsigned(a.n_head), 1u, C), dim3(kThreads), 0, s, C, a, q, pos, (const __half*)K,
                           (const __half*)V, out, err, q8);
        return;
    } else if (fast && decode_f16_kernel_on()) {
        launch("attention_decode", a.head_dim == 64 ? attention_decode_f16<64> : attention_decode_f16<128>,
               dim3(unsigned(a.n_head), 1u, unsigned(S)), dim3(kThreads), 0, s, a, q, pos, (const __half*)K,
               (const __half*)V, out, scratch, err, KvPages{}, int64_t(0), int64_t(0), 1);
    } else {
        launch("attention", attention_kernel, dim3(unsigned(a.n_head), unsigned(a.rows), unsigned(S)), dim3(kThreads), 0, s,
               a, q, ldq, pos, (const uint8_t*)K, (const uint8_t*)V, out, ldo, scratch, err, KvPages{});
    }
    if (S > 1) launch_combine(a, S, pos, scratch, out, ldo, q8, s);
}

// How many query heads of one KV head a paged decode block attends (attention_decode_f16's group): all of
// them where the grid still has two blocks an SM (rows x KV heads x splits), else one.  Grouped, a sequence's
// K and V rows are read once a KV head instead of once a query head.  The kernel choice cuda.attention_group
// forces one (tests compare them).
int paged_head_group(const AttnShape& a, int S) {
    const int G = a.n_head / a.n_head_kv;
    const std::string v = forced_kernel("cuda.attention_group");
    if (v == "1") return 1;
    if (v == "all") return G;
    return int64_t(a.rows) * a.n_head_kv * S >= 2 * int64_t(sm_count()) ? G : 1;
}

size_t attention_paged_scratch_floats(const AttnShape& a) {
    const int S = std::max((a.n_ctx + kChunk - 1) / kChunk, decode_tc_on(a) ? decode_tc_splits(a) : 1);
    return S > 1 ? size_t(a.rows) * size_t(a.n_head) * size_t(S) * size_t(a.head_dim + 2) : 0;
}

bool attention_paged(const AttnShape& a, const KvPages& pages, const float* q, int64_t ldq, const int32_t* pos,
                     const void* K, const void* V, float* out, int64_t ldo, float* scratch, uint32_t* err,
                     cudaStream_t s, MmaAct xb) {
    check_heads(a);
    check_mma_act("attention_paged", xb, a.rows, int64_t(a.n_head) * a.head_dim);
    const bool tc = pages.block_size % 16 == 0 && decode_tc_on(a);  // a warp's 16 positions in one pool block
    // splits past a row's position exit at once
    const int S = tc ? decode_tc_splits(a) : (a.n_ctx + kChunk - 1) / kChunk;
    check_splits(a, S);
    if (tc) {
        launch_decode_tc(a, dim3(unsigned(a.n_head_kv), unsigned(a.rows), unsigned(S)), s, q, pos, (const __half*)K,
                         (const __half*)V, out, scratch, err, pages, ldq, ldo, xb);
    } else if (a.kv_type == GGML_TYPE_F16 && (a.head_dim == 64 || a.head_dim == 128) && pages.block_size % 32 == 0 &&
        a.window == 0 && decode_f16_kernel_on()) {
        const int group = paged_head_group(a, S);
        auto kernel = group > 1 ? (a.head_dim == 64 ? attention_decode_f16<64, true> : attention_decode_f16<128, true>)
                                : (a.head_dim == 64 ? attention_decode_f16<64> : attention_decode_f16<128>);
        launch("attention_paged", kernel, dim3(unsigned(a.n_head / group), unsigned(a.rows), unsigned(S)), dim3(kThreads), 0, s, a, q, pos,
               (const __half*)K, (const __half*)V, out, scratch, err, pages, ldq, ldo, group);
    } else
        launch("attention_paged", attention_kernel, dim3(unsigned(a.n_head), unsigned(a.rows), unsigned(S)),
               dim3(kThreads), 0, s, a, q, ldq, pos, (const uint8_t*)K, (const uint8_t*)V, out, ldo, scratch, err, pages);
    if (S > 1) launch_combine(a, S, pos, scratch, out, ldo, Q8Act{}, s, xb);
    return xb.p && (S > 1 || tc);
}

}  // namespace minfer::cuda
