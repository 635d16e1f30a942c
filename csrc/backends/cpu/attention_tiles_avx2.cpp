// The register-tiled attention (attention_tiles.inc) on AVX2: 8 lanes, 6 queries x 16 keys of scores and
// 2 queries x 32 dims of sums a pass (12 and 8 accumulators of the 16 registers).
#include <immintrin.h>

#include "backends/cpu/attention_tiles.inc"

namespace minfer {

namespace {

struct Avx2 {
    using V = __m256;
    static constexpr int W = 8, kScoreRows = 6, kSumRows = 2, kSumVecs = 4;
    static V zero() { return _mm256_setzero_ps(); }
    static V load(const float* p) { return _mm256_load_ps(p); }
    static void store(float* p, V v) { _mm256_store_ps(p, v); }
    static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
    static V set1(float x) { return _mm256_set1_ps(x); }
    static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static V mul(V a, V b) { return _mm256_mul_ps(a, b); }

    // 8 x 8 floats: out row i (at out + i * out_ld) = column i of the 8 rows at in + i * in_ld.
    static void transpose(const float* in, int in_ld, float* out, int out_ld) {
        __m256 r[8], t[8], u[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(in + i * in_ld);
        for (int i = 0; i < 8; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int k = 0; k < 8; k += 4) {  // u[k + c]: column c of rows k..k+3, then column c + 4
            u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
            u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xee);
            u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
            u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xee);
        }
        for (int c = 0; c < 4; c++) {
            _mm256_storeu_ps(out + c * out_ld, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
            _mm256_storeu_ps(out + (c + 4) * out_ld, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
        }
    }
};

}  // namespace

void tiles_attention_task_avx2(const AttnTask& t) { tiles::task<Avx2>(t); }

}  // namespace minfer
