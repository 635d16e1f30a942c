// The register-tiled attention (attention_tiles.inc) on AVX-512: 16 lanes, 8 queries x 32 keys of scores and
// 4 queries x 64 dims of sums a pass (16 accumulators of the 32 registers).
#include <immintrin.h>

#include "backends/cpu/attention_tiles.inc"

namespace minfer {

namespace {

struct Avx512 {
    using V = __m512;
    static constexpr int W = 16, kScoreRows = 8, kSumRows = 4, kSumVecs = 4;
    static V zero() { return _mm512_setzero_ps(); }
    static V load(const float* p) { return _mm512_load_ps(p); }
    static void store(float* p, V v) { _mm512_store_ps(p, v); }
    static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
    static V set1(float x) { return _mm512_set1_ps(x); }
    static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }

    // 16 x 16 floats: out row i (at out + i * out_ld) = column i of the 16 rows at in + i * in_ld.
    static void transpose(const float* in, int in_ld, float* out, int out_ld) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(in + i * in_ld);
        for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int k = 0; k < 16; k += 4) {  // then r[k + c], lane L: column c + 4 L of rows k..k+3
            const __m512d t0 = _mm512_castps_pd(t[k]), t1 = _mm512_castps_pd(t[k + 1]);
            const __m512d t2 = _mm512_castps_pd(t[k + 2]), t3 = _mm512_castps_pd(t[k + 3]);
            r[k] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
            r[k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
            r[k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
            r[k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
        }
        for (int c = 0; c < 4; c++) {  // the lanes of column c + 4 L gathered from the four row groups
            const __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
            const __m512 v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
            const __m512 w0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
            const __m512 w1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
            _mm512_storeu_ps(out + c * out_ld, _mm512_shuffle_f32x4(v0, w0, 0x88));
            _mm512_storeu_ps(out + (c + 8) * out_ld, _mm512_shuffle_f32x4(v0, w0, 0xdd));
            _mm512_storeu_ps(out + (c + 4) * out_ld, _mm512_shuffle_f32x4(v1, w1, 0x88));
            _mm512_storeu_ps(out + (c + 12) * out_ld, _mm512_shuffle_f32x4(v1, w1, 0xdd));
        }
    }
};

}  // namespace

void tiles_attention_task_avx512(const AttnTask& t) { tiles::task<Avx512>(t); }

}  // namespace minfer
