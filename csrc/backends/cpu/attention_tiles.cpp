// Attention in f32 on AVX-512 register tiles, the GEMM way: scores as Q K^T with a chunk of keys transposed so
// that keys run along the vector lanes (each query's value broadcast, one multiply-add per dim into 2 x 16 keys,
// up to 8 queries a pass: no horizontal sums), then the output as P V with dims along the lanes (up to 4 queries x
// 64 dims a pass, each probability broadcast).  Every multiply-add feeds the tile's 16 accumulators instead of
// a dependent chain, so the FMA units, not their latency, set the pace.
//
// A row's arithmetic depends only on itself: each score is one chain of multiply-adds over the dims in order,
// each output one chain over the keys in order (keys a row does not see enter with probability 0), the softmax
// is the f32 kernel's; so decode rows, prompt rows and any cut of the work into tasks give the same bits.
#include "backends/cpu/attention_task.h"

#include <cstring>
#include <vector>

#include "backends/kv_format.h"
#include "common/error.h"

#if defined(MINFER_HAVE_ATTENTION_TILES)
#include <immintrin.h>
#endif

namespace minfer {

#if defined(MINFER_HAVE_ATTENTION_TILES)
namespace {

constexpr int kKeys = 32;  // a chunk: two vectors of keys a score tile row (16 KB of f32 keys at head_dim 128)

// 16 x 16 floats: out row i (at out + i * out_ld) = column i of the 16 rows at in + i * in_ld.
void transpose16(const float* in, int in_ld, float* out, int out_ld) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(in + i * in_ld);
    for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int k = 0; k < 16; k += 4) {  // r[k + c], lane L: column c + 4 L of rows k..k+3
        const __m512d t0 = _mm512_castps_pd(t[k]), t1 = _mm512_castps_pd(t[k + 1]);
        const __m512d t2 = _mm512_castps_pd(t[k + 2]), t3 = _mm512_castps_pd(t[k + 3]);
        r[k] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int c = 0; c < 4; c++) {  // the lanes of column c + 4 L gathered from the four row groups
        const __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        const __m512 w0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 w1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
        _mm512_storeu_ps(out + c * out_ld, _mm512_shuffle_f32x4(v0, w0, 0x88));
        _mm512_storeu_ps(out + (c + 8) * out_ld, _mm512_shuffle_f32x4(v0, w0, 0xdd));
        _mm512_storeu_ps(out + (c + 4) * out_ld, _mm512_shuffle_f32x4(v1, w1, 0x88));
        _mm512_storeu_ps(out + (c + 12) * out_ld, _mm512_shuffle_f32x4(v1, w1, 0xdd));
    }
}

// S[m][0..32) = scale * sum_d Q[m][d] Kt[d][0..32) for NM queries (Q rows hd apart, S rows s_ld apart).
template <int NM>
void scores_tile(const float* Q, int hd, const float* Kt, float scale, float* S, int64_t s_ld) {
    __m512 a[NM][2];
#pragma GCC unroll 8
    for (int m = 0; m < NM; m++) a[m][0] = a[m][1] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m512 k0 = _mm512_load_ps(Kt + kKeys * d), k1 = _mm512_load_ps(Kt + kKeys * d + 16);
#pragma GCC unroll 8
        for (int m = 0; m < NM; m++) {
            const __m512 q = _mm512_set1_ps(Q[m * hd + d]);
            a[m][0] = _mm512_fmadd_ps(q, k0, a[m][0]);
            a[m][1] = _mm512_fmadd_ps(q, k1, a[m][1]);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int m = 0; m < NM; m++) {
        _mm512_storeu_ps(S + m * s_ld, _mm512_mul_ps(a[m][0], s));
        _mm512_storeu_ps(S + m * s_ld + 16, _mm512_mul_ps(a[m][1], s));
    }
}

// O[m][0..16 ND) += sum_i P[m][i] V[i][0..16 ND) over keys i < n in order, for NM queries.
template <int NM, int ND>
void sums_tile(const float* P, int64_t p_ld, const float* V, int hd, int n, float* O, int o_ld) {
    __m512 a[NM][ND];
#pragma GCC unroll 16
    for (int m = 0; m < NM; m++)
        for (int k = 0; k < ND; k++) a[m][k] = _mm512_load_ps(O + m * o_ld + 16 * k);
    for (int i = 0; i < n; i++) {
        __m512 v[ND];
#pragma GCC unroll 4
        for (int k = 0; k < ND; k++) v[k] = _mm512_load_ps(V + i * hd + 16 * k);
#pragma GCC unroll 16
        for (int m = 0; m < NM; m++) {
            const __m512 p = _mm512_set1_ps(P[m * p_ld + i]);
            for (int k = 0; k < ND; k++) a[m][k] = _mm512_fmadd_ps(p, v[k], a[m][k]);
        }
    }
#pragma GCC unroll 16
    for (int m = 0; m < NM; m++)
        for (int k = 0; k < ND; k++) _mm512_store_ps(O + m * o_ld + 16 * k, a[m][k]);
}

using ScoresFn = void (*)(const float*, int, const float*, float, float*, int64_t);
using SumsFn = void (*)(const float*, int64_t, const float*, int, int, float*, int);
const ScoresFn scores_by_rows[8] = {scores_tile<1>, scores_tile<2>, scores_tile<3>, scores_tile<4>,
                                    scores_tile<5>, scores_tile<6>, scores_tile<7>, scores_tile<8>};
const SumsFn sums_by_shape[4][4] = {
    {sums_tile<1, 1>, sums_tile<1, 2>, sums_tile<1, 3>, sums_tile<1, 4>},
    {sums_tile<2, 1>, sums_tile<2, 2>, sums_tile<2, 3>, sums_tile<2, 4>},
    {sums_tile<3, 1>, sums_tile<3, 2>, sums_tile<3, 3>, sums_tile<3, 4>},
    {sums_tile<4, 1>, sums_tile<4, 2>, sums_tile<4, 3>, sums_tile<4, 4>},
};

// n floats, 64-byte aligned, out of one per-thread buffer
struct Arena {
    std::vector<float> buf;
    size_t used = 0;
    void reset(size_t floats) {
        if (buf.size() < floats + 16 * 8) buf.resize(floats + 16 * 8);
        used = 0;
    }
    float* take(size_t n) {
        float* p = buf.data() + used;
        p += (16 - uintptr_t(p) / 4 % 16) % 16;
        used = size_t(p - buf.data()) + n;
        return p;
    }
};

}  // namespace

bool tiles_attention_fits(int head_dim) { return head_dim % 16 == 0 && head_dim <= 256; }

void tiles_attention_task(const AttnTask& t) {
    const int hd = t.head_dim, nh = t.h1 - t.h0, M = int(t.r1 - t.r0) * nh;
    const int base = t.k_lo / kKeys * kKeys, end = (t.n_keys + kKeys - 1) / kKeys * kKeys, span = end - base;
    const KvLayout& kv = *t.kv;
    const size_t slice0 = kv_row_bytes(kv.type, int64_t(t.g) * hd), slice = kv_row_bytes(kv.type, hd);
    thread_local Arena mem;
    mem.reset(size_t(M) * size_t(hd) * 2 + size_t(2 * kKeys * hd) + size_t(M) * size_t(span) + size_t(M));
    float* Q = mem.take(size_t(M) * size_t(hd));   // [query][dim]
    float* C = mem.take(size_t(kKeys * hd));       // a chunk's rows [key][dim]
    float* Kt = mem.take(size_t(kKeys * hd));      // its keys transposed [dim][key]
    float* S = mem.take(size_t(M) * size_t(span)); // [query][key], key j at j - base
    float* O = mem.take(size_t(M) * size_t(hd));   // [query][dim], unnormalized
    float* inv = mem.take(size_t(M));
    auto query_row = [&](int m) { return t.r0 + m / nh; };
    for (int m = 0; m < M; m++)
        std::memcpy(Q + size_t(m) * size_t(hd), t.q + query_row(m) * t.q_ld + int64_t(t.h0 + m % nh) * hd,
                    size_t(hd) * 4);

    // a chunk's rows of the cache in f32 (keys the task does not read: 0); the next chunk's rows asked into L2
    auto convert = [&](const uint8_t* cache, int j0) {
        for (int i = 0; i < kKeys; i++) {
            const int j = j0 + i;
            float* c = C + size_t(i) * size_t(hd);
            if (j < t.k_lo || j >= t.n_keys) {
                std::memset(c, 0, size_t(hd) * 4);
                continue;
            }
            if (j + kKeys < t.n_keys)
                for (size_t b = 0; b < slice; b += 64) __builtin_prefetch(t.key(cache, j + kKeys) + slice0 + b, 0, 2);
            if (kv.type == GGML_TYPE_F16) kv_read_f16(t.key(cache, j), int64_t(t.g) * hd, c, hd);
            else kv_read_row(kv.type, t.key(cache, j), int64_t(t.g) * hd, c, hd);
        }
    };

    for (int j0 = base; j0 < end; j0 += kKeys) {
        convert(t.k_cache, j0);
        for (int kb = 0; kb < kKeys; kb += 16)
            for (int d = 0; d < hd; d += 16) transpose16(C + kb * hd + d, hd, Kt + d * kKeys + kb, kKeys);
        for (int m0 = 0; m0 < M; m0 += 8)
            scores_by_rows[std::min(8, M - m0) - 1](Q + size_t(m0) * size_t(hd), hd, Kt, t.scale,
                                                    S + size_t(m0) * size_t(span) + (j0 - base), span);
    }
    // the softmax over each row's keys; every other key of the chunks gets probability 0
    for (int m = 0; m < M; m++) {
        const int64_t r = query_row(m);
        const int lo = t.first_key(r), hi = t.pos[r] + 1;
        float* s = S + size_t(m) * size_t(span) - base;
        inv[m] = softmax_unnormalized(s + lo, hi - lo);
        std::memset(s + base, 0, size_t(lo - base) * 4);
        std::memset(s + hi, 0, size_t(end - hi) * 4);
    }

    std::memset(O, 0, size_t(M) * size_t(hd) * 4);
    for (int j0 = base; j0 < end; j0 += kKeys) {
        const int a = std::max(j0, t.k_lo), e = std::min(j0 + kKeys, t.n_keys);
        convert(t.v_cache, j0);
        for (int m0 = 0; m0 < M; m0 += 4)
            for (int d0 = 0; d0 < hd; d0 += 64)
                sums_by_shape[std::min(4, M - m0) - 1][std::min(4, (hd - d0) / 16) - 1](
                    S + size_t(m0) * size_t(span) + (a - base), span, C + size_t(a - j0) * size_t(hd) + d0, hd, e - a,
                    O + size_t(m0) * size_t(hd) + d0, hd);
    }
    for (int m = 0; m < M; m++) {
        float* y = t.out + query_row(m) * t.out_ld + int64_t(t.h0 + m % nh) * hd;
        const __m512 f = _mm512_set1_ps(inv[m]);
        for (int d = 0; d < hd; d += 16)
            _mm512_storeu_ps(y + d, _mm512_mul_ps(_mm512_load_ps(O + size_t(m) * size_t(hd) + size_t(d)), f));
    }
}

#else  // a build without AVX-512

bool tiles_attention_fits(int) { return false; }

void tiles_attention_task(const AttnTask&) { throw MinferError("Attn: this build has no AVX-512 attention tiles"); }

#endif

}  // namespace minfer
