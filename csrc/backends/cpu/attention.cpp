#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/kv_format.h"
#include "common/error.h"

namespace minfer {

namespace {
// s[j] <- exp(s[j] - max s); returns 1 / sum (double-accumulated), the factor
// the callers fold into their weighted sum of values.
float softmax_unnormalized(float* s, int nk) {
    float mx = -INFINITY;
    for (int j = 0; j < nk; j++) mx = std::max(mx, s[j]);
    double sum = 0.0;
    for (int j = 0; j < nk; j++) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
    }
    return float(1.0 / sum);
}
}  // namespace

void cpu_kv_store(const float* k, int64_t k_ld, const float* v, int64_t v_ld, int64_t rows, const int32_t* pos,
                  uint8_t* k_cache, uint8_t* v_cache, const KvLayout& kv) {
    const size_t rb = kv_row_bytes(kv.type, kv.dim);
    for (int64_t r = 0; r < rows; r++) {
        if (pos[r] < 0 || pos[r] >= kv.n_ctx)
            throw MinferError(strfmt("KvStore: position %d is outside the KV cache of %d positions", pos[r], kv.n_ctx));
        kv_write_row(kv.type, k + r * k_ld, k_cache + size_t(pos[r]) * rb, kv.dim);
        kv_write_row(kv.type, v + r * v_ld, v_cache + size_t(pos[r]) * rb, kv.dim);
    }
}

void cpu_attention(const float* q, int64_t q_ld, float* out, int64_t out_ld, int64_t rows, const int32_t* pos,
                   const uint8_t* k_cache, const uint8_t* v_cache, const KvLayout& kv, int n_head, int n_head_kv,
                   int head_dim, float scale, ThreadPool& pool, const DotKernels& kernels) {
    const int group = n_head / n_head_kv;
    const size_t rb = kv_row_bytes(kv.type, kv.dim);
    const vec_dot_fn dot = kernels.dot[GGML_TYPE_F32];
    // Tasks: (kv head, block of query rows).  A task converts the keys and values
    // of its kv head once and serves every query head of the group with them.
    constexpr int64_t kBlock = 16;
    const int64_t n_blocks = (rows + kBlock - 1) / kBlock;
    for (int64_t r = 0; r < rows; r++)
        if (pos[r] < 0 || pos[r] >= kv.n_ctx)
            throw MinferError(strfmt("Attn: position %d is outside the KV cache of %d positions", pos[r], kv.n_ctx));
    if (kv.type == GGML_TYPE_F16) {
        // The default f16 cache is read in place: scores_f16 and axpy_f16
        // (kv_format).  Without a conversion pass a task can be one query head
        // (decode has only 2-3 KV heads: too few tasks for the pool).  Prefill
        // and decode run the very same arithmetic per (row, head), so a token's
        // result does not depend on how the tokens were batched into evals
        // (prefix reuse gives the answer a fresh prompt gives).
        pool.parallel_for(int64_t(n_head) * n_blocks, [&](int64_t task, int) {
            const int h = int(task % n_head), g = h / group;
            const int64_t r0 = (task / n_head) * kBlock, r1 = std::min(rows, r0 + kBlock);
            thread_local std::vector<float> s;
            const uint16_t* K = (const uint16_t*)k_cache + int64_t(g) * head_dim;
            const uint16_t* V = (const uint16_t*)v_cache + int64_t(g) * head_dim;
            const size_t stride = rb / 2;  // in f16 values
            for (int64_t r = r0; r < r1; r++) {
                const int nk = pos[r] + 1;
                s.resize(size_t(nk));
                const float* qh = q + r * q_ld + int64_t(h) * head_dim;
                float* oh = out + r * out_ld + int64_t(h) * head_dim;
                scores_f16(qh, K, stride, nk, head_dim, scale, s.data());
                const float inv = softmax_unnormalized(s.data(), nk);
                for (int d = 0; d < head_dim; d++) oh[d] = 0.0f;
                for (int j = 0; j < nk; j++) axpy_f16(s[size_t(j)] * inv, V + size_t(j) * stride, oh, head_dim);
            }
        });
        return;
    }
    pool.parallel_for(int64_t(n_head_kv) * n_blocks, [&](int64_t task, int) {
        const int g = int(task % n_head_kv);
        const int64_t r0 = (task / n_head_kv) * kBlock, r1 = std::min(rows, r0 + kBlock);
        int n_keys = 0;
        for (int64_t r = r0; r < r1; r++) n_keys = std::max(n_keys, pos[r] + 1);
        // per-thread scratch, reused across calls: [n_keys, head_dim] keys and values, scores
        thread_local std::vector<float> K, V, s;
        K.resize(size_t(n_keys) * size_t(head_dim));
        V.resize(size_t(n_keys) * size_t(head_dim));
        s.resize(size_t(n_keys));
        for (int j = 0; j < n_keys; j++) {
            kv_read_row(kv.type, k_cache + size_t(j) * rb, int64_t(g) * head_dim, &K[size_t(j) * size_t(head_dim)], head_dim);
            kv_read_row(kv.type, v_cache + size_t(j) * rb, int64_t(g) * head_dim, &V[size_t(j) * size_t(head_dim)], head_dim);
        }
        for (int64_t r = r0; r < r1; r++) {
            const int nk = pos[r] + 1;
            for (int h = g * group; h < (g + 1) * group; h++) {
                const float* qh = q + r * q_ld + int64_t(h) * head_dim;
                float* oh = out + r * out_ld + int64_t(h) * head_dim;
                for (int j = 0; j < nk; j++) s[size_t(j)] = dot(head_dim, &K[size_t(j) * size_t(head_dim)], qh) * scale;
                const float inv = softmax_unnormalized(s.data(), nk);
                for (int d = 0; d < head_dim; d++) oh[d] = 0.0f;
                for (int j = 0; j < nk; j++) {
                    const float p = s[size_t(j)] * inv;
                    const float* vj = &V[size_t(j) * size_t(head_dim)];
                    for (int d = 0; d < head_dim; d++) oh[d] += p * vj[d];
                }
            }
        }
    });
}

}  // namespace minfer
