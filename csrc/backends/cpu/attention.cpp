#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "common/exp_avx2.h"
#endif

#include "backends/cpu/attention_task.h"
#include "backends/kernel_choice.h"
#include "backends/kv_format.h"
#include "common/error.h"

namespace minfer {

// s[j] <- exp(s[j] - max s); returns 1 / sum (double-accumulated), the factor
// the callers fold into their weighted sum of values.  Every position goes
// through the same exp (the last partial group of 8 is padded), so a row's
// result depends only on its own scores.
float softmax_unnormalized(float* s, int nk) {
    float mx = -INFINITY;
#if defined(__AVX2__) && defined(__FMA__)
    // the maximum in eight lanes (exact in any order; a scalar chain of maxss cost 6 % of decode attention)
    int j8 = 0;
    if (nk >= 8) {
        __m256 vm = _mm256_loadu_ps(s);
        for (j8 = 8; j8 + 8 <= nk; j8 += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j8));
        alignas(32) float l[8];
        _mm256_store_ps(l, vm);
        for (float v : l) mx = std::max(mx, v);
    }
    for (; j8 < nk; j8++) mx = std::max(mx, s[j8]);
    const __m256 m = _mm256_set1_ps(mx);
    __m256d sum0 = _mm256_setzero_pd(), sum1 = _mm256_setzero_pd();
    for (int j = 0; j < nk; j += 8) {
        alignas(32) float t[8];
        const int n = std::min(8, nk - j);
        float* g = s + j;
        if (n < 8) {  // the tail, padded with -inf (exp 0)
            for (int i = 0; i < 8; i++) t[i] = i < n ? s[j + i] : -INFINITY;
            g = t;
        }
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(g), m));
        _mm256_storeu_ps(g, e);
        if (n < 8)
            for (int i = 0; i < n; i++) s[j + i] = t[i];
        sum0 = _mm256_add_pd(sum0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        sum1 = _mm256_add_pd(sum1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    alignas(32) double d[4];
    _mm256_store_pd(d, _mm256_add_pd(sum0, sum1));
    return float(1.0 / ((d[0] + d[1]) + (d[2] + d[3])));
#else
    for (int j = 0; j < nk; j++) mx = std::max(mx, s[j]);
    double sum = 0.0;
    for (int j = 0; j < nk; j++) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
    }
    return float(1.0 / sum);
#endif
}

namespace {

// s[j] = scale * (q . K row j), K: nk rows of hd floats, each summed over the dims in order.
void scores(const float* q, const float* K, int nk, int hd, float scale, float* s) {
    for (int j = 0; j < nk; j++) {
        const float* k = K + size_t(j) * size_t(hd);
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc += q[d] * k[d];
        s[j] = acc * scale;
    }
}

// y (+)= sum_j (p[j] * scale) V row j, j < nk, V: nk rows of hd floats: one
// multiply-add per key and dim, in key order, starting from 0 (first) or from
// y, so a row's keys taken in several chunks give the same sums as in one.
void weighted_sum(const float* p, float scale, const float* V, int nk, int hd, float* y, bool first) {
    if (first)
        for (int d = 0; d < hd; d++) y[d] = 0.0f;
    for (int j = 0; j < nk; j++) {
        const float a = p[j] * scale;
        const float* vj = V + size_t(j) * size_t(hd);
        for (int d = 0; d < hd; d++) y[d] = std::fma(a, vj[d], y[d]);
    }
}

// The task in portable f32 (NEON and scalar builds, and heads the register tiles do not take): each chunk
// of keys converted to f32 once, dot products and weighted sums a (row, head) at a time.
void f32_attention_task(const AttnTask& t) {
    constexpr int kChunk = 32;  // 16 KB of f32 for head_dim 128 (L1)
    const int head_dim = t.head_dim, h0 = t.h0, h1 = t.h1, nh = h1 - h0, k_lo = t.k_lo, n_keys = t.n_keys;
    const int64_t r0 = t.r0, r1 = t.r1;
    const int32_t* pos = t.pos;
    auto first_key = [&](int64_t r) { return t.first_key(r); };
    const int span = n_keys - k_lo;
    // per-thread scratch, reused across calls: one chunk of keys or values, the scores of every
    // (row, head) of the task ([rows][heads][span], key j at j - k_lo) and their softmax factors
    thread_local std::vector<float> C, S, inv;
    C.resize(size_t(kChunk) * size_t(head_dim));
    S.resize(size_t(r1 - r0) * size_t(nh) * size_t(span));
    inv.resize(size_t(r1 - r0) * size_t(nh));
    // each chunk of the cache, converted once, to every row of the task that sees part of it (fn serves
    // the task's heads): fn(row, first key, keys, its offset in the chunk).  Chunks start at multiples of
    // kChunk and a row's keys in a chunk depend only on its position, so its arithmetic does too.
    // Each row converted asks for the matching row of the next chunk: the fetch then has a whole chunk's
    // arithmetic to arrive in.
    auto over_chunks = [&](const uint8_t* cache, auto&& fn) {
        const int hdim = head_dim;  // a local: the stores below could alias the captured one
        for (int j0 = k_lo / kChunk * kChunk; j0 < n_keys; j0 += kChunk) {
            const int n = std::min(kChunk, n_keys - j0);
            for (int j = std::max(0, k_lo - j0); j < n; j++) t.read_row(cache, j0 + j, kChunk, &C[size_t(j) * size_t(hdim)]);
            for (int64_t r = r0; r < r1; r++) {
                const int a = std::max(j0, first_key(r)), e = std::min(j0 + n, pos[r] + 1);
                if (a < e) fn(r, a, e - a, a - j0);
            }
        }
    };
    auto at = [&](int64_t r, int h) { return size_t(r - r0) * size_t(nh) + size_t(h - h0); };
    auto score = [&](int64_t r, int h, int j) { return &S[at(r, h) * size_t(span) + size_t(j - k_lo)]; };
    over_chunks(t.k_cache, [&](int64_t r, int j, int nk, int c) {
        for (int h = h0; h < h1; h++)
            scores(t.q + r * t.q_ld + int64_t(h) * head_dim, &C[size_t(c) * size_t(head_dim)], nk, head_dim, t.scale,
                   score(r, h, j));
    });
    for (int64_t r = r0; r < r1; r++)
        for (int h = h0; h < h1; h++)
            inv[at(r, h)] = softmax_unnormalized(score(r, h, first_key(r)), pos[r] + 1 - first_key(r));
    over_chunks(t.v_cache, [&](int64_t r, int j, int nk, int c) {
        auto y = [&](int h) { return t.out + r * t.out_ld + int64_t(h) * head_dim; };
        const float* V = &C[size_t(c) * size_t(head_dim)];
        const bool first = j == first_key(r);
        for (int h = h0; h < h1; h++) weighted_sum(score(r, h, j), inv[at(r, h)], V, nk, head_dim, y(h), first);
    });
}

struct Tiles {
    void (*task)(const AttnTask&);
    int width;  // lanes
};

// The register tiles for a session's ISA tier ({null, 0}: this build has none for it).
Tiles tiles_for(Isa isa) {
#if defined(MINFER_HAVE_AVX512)
    if (isa == Isa::avx512) return {tiles_attention_task_avx512, 16};
#endif
#if defined(MINFER_HAVE_AVX2)
    if (isa == Isa::avx2 || isa == Isa::avx512) return {tiles_attention_task_avx2, 8};
#endif
#if defined(MINFER_HAVE_NEON)
    if (isa == Isa::neon) return {tiles_attention_task_neon, 4};
#endif
    (void)isa;
    return {nullptr, 0};
}

bool tiles_fit(int head_dim, Isa isa) {
    const int w = tiles_for(isa).width;
    return w > 0 && head_dim % w == 0 && head_dim <= 256;
}

}  // namespace

const char* cpu_attention_kernel(uint32_t kv_type, int head_dim, Isa isa) {
    (void)kv_type;  // every cache type is read through the same f32 conversion
    return tiles_fit(head_dim, isa) ? "tiles" : "f32";
}

void cpu_kv_store(const float* k, int64_t k_ld, const float* v, int64_t v_ld, int64_t rows, const int32_t* pos,
                  uint8_t* k_cache, uint8_t* v_cache, const KvLayout& kv) {
    const size_t rb = kv_row_bytes(kv.type, kv.dim);
    for (int64_t r = 0; r < rows; r++) {
        if (pos[r] < 0 || pos[r] >= kv.n_ctx)
            throw MinferError(strfmt("KvStore: position %d is outside the KV cache of %d positions", pos[r], kv.n_ctx));
        kv_write_row(kv.type, k + r * k_ld, k_cache + kv.row(pos[r]) * rb, kv.dim);
        kv_write_row(kv.type, v + r * v_ld, v_cache + kv.row(pos[r]) * rb, kv.dim);
    }
}

void cpu_attention(const float* q, int64_t q_ld, float* out, int64_t out_ld, int64_t rows, const int32_t* pos,
                   const uint8_t* k_cache, const uint8_t* v_cache, const KvLayout& kv, int n_head, int n_head_kv,
                   int head_dim, float scale, int window, ThreadPool& pool, Isa isa, const KvPages* pages) {
    const int group = n_head / n_head_kv;
    const size_t rb = kv_row_bytes(kv.type, kv.dim);
    if (kv.ring > 0 && (pages || window <= 0 || window > kv.ring))
        throw MinferError(strfmt("Attn: a KV ring of %d rows needs one sequence and a window that fits it (window %d)",
                                 kv.ring, window));
    // Runs of query rows that share one sequence's keys: the whole step for one sequence, each sequence's
    // rows in a batch.
    std::vector<std::pair<int64_t, int64_t>> runs;
    const int bs = pages ? pages->block_size : 0;
    const int max_pos = pages ? pages->max_blocks * bs : kv.n_ctx;
    for (int64_t r = 0; r < rows; r++) {
        if (pos[r] < 0 || pos[r] >= max_pos)
            throw MinferError(strfmt("Attn: position %d is outside the %s of %d positions", pos[r],
                                     pages ? "block table" : "KV cache", max_pos));
        if (!pages) continue;
        const int s = pages->seq[r];
        if (s < 0 || s >= pages->n_seqs) throw MinferError(strfmt("Attn: row %lld has sequence %d of %d", (long long)r, s, pages->n_seqs));
        if (r == 0 || pages->seq[r] != pages->seq[r - 1]) runs.push_back({r, r + 1});
        else runs.back().second = r + 1;
    }
    if (!pages) runs.push_back({0, rows});
    for (auto [a, e] : pages ? runs : decltype(runs){}) {  // every block a run's rows read, once a run
        const int s = pages->seq[a];
        int last = 0, first = pos[a];
        for (int64_t r = a; r < e; r++) last = std::max(last, pos[r]), first = std::min(first, pos[r]);
        // (a window: only the blocks of its keys; a sliding-window pool frees those before)
        const int lo = window > 0 ? std::max(0, first - window + 1) : 0;
        for (int b = lo / bs; b <= last / bs; b++) {
            const int id = pages->tables[size_t(s) * size_t(pages->max_blocks) + size_t(b)];
            if (id < 0 || int64_t(id) * bs >= kv.n_ctx)
                throw MinferError(strfmt("Attn: sequence %d's block %d is %d, outside the pool of %d blocks", s, b, id,
                                         kv.n_ctx / bs));
        }
    }
    // Tasks: (kv head, block of query rows, part of the heads sharing that kv
    // head).  A task reads its kv head's keys and values once, in chunks
    // converted while they sit in L1, and serves its query heads and rows with each chunk.
    // The heads of a group are split only when there are too few tasks for the
    // pool (decode: 2-8 kv heads).  Each (row, head) runs the same arithmetic
    // however tasks and chunks are cut and tokens batched, so prefix reuse gives
    // the answer a fresh prompt gives.  The kernel follows the cache, the CPU and the session's ISA tier
    // alone (register tiles as wide as the tier's vectors where it has them), the same for every row: decode
    // and prompt rows agree.
    constexpr int64_t kBlock = 16;
    std::vector<std::pair<int64_t, int64_t>> blocks;  // query rows of one run, kBlock at most
    for (auto [a, e] : runs)
        for (int64_t r = a; r < e; r += kBlock) blocks.push_back({r, std::min(e, r + kBlock)});
    const int64_t n_blocks = int64_t(blocks.size());
    int parts = 1;
    while (parts < group && int64_t(n_head_kv) * n_blocks * parts < pool.size()) parts++;
    const int per_part = (group + parts - 1) / parts;
    const std::string forced = forced_kernel("cpu.attention"), rule = cpu_attention_kernel(kv.type, head_dim, isa);
    const std::string kernel = forced.empty() ? rule : forced;
    if (kernel == "tiles" && !tiles_fit(head_dim, isa))
        throw MinferError(strfmt("Attn: cpu.attention=tiles cannot run here (it needs the avx2, avx512 or neon kernels "
                                 "and heads of a multiple of their vector width up to 256; head_dim %d, %s)", head_dim,
                                 isa_name(isa)));
    const size_t head_bytes = kv_row_bytes(kv.type, head_dim);
    void (*const run_task)(const AttnTask&) = kernel == "tiles" ? tiles_for(isa).task : f32_attention_task;
    pool.parallel_for(int64_t(n_head_kv) * n_blocks * parts, [&](int64_t task, int) {
        const int g = int(task % n_head_kv), part = int(task / n_head_kv % parts);
        const auto [r0, r1] = blocks[size_t(task / (int64_t(n_head_kv) * parts))];
        const int h0 = g * group + part * per_part, h1 = std::min((g + 1) * group, h0 + per_part);
        if (h0 >= h1) return;
        AttnTask t{q, q_ld, out, out_ld, r0, r1, pos, window, g, h0, h1, head_dim, scale, k_cache, v_cache, rb, head_bytes,
                   &kv, pages ? pages->tables + size_t(pages->seq[r0]) * size_t(pages->max_blocks) : nullptr, bs, 0, 0};
        // row r sees keys [first_key(r), pos[r]]; the task, keys [k_lo, n_keys)
        t.k_lo = pos[r0];
        for (int64_t r = r0; r < r1; r++) {
            t.n_keys = std::max(t.n_keys, pos[r] + 1);
            t.k_lo = std::min(t.k_lo, t.first_key(r));
        }
        run_task(t);
    });
}

}  // namespace minfer
