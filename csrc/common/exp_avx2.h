// e^x eight floats at a time (AVX2 + FMA), shared by the CPU attention's
// softmax and the FFN gate (quant/swiglu_x86.inc): x = n ln2 + r (|r| <= ln2 / 2,
// ln2 split in two for an exact product), e^r by the Cephes polynomial, 2^n
// through the exponent bits; about 1 ulp.  Below -87.3 (where 2^n would leave
// the normal range) 0; above 88.3 the value at 88.3 (finite).  `static inline`
// for the reason half.h gives: translation units with different -m flags
// include it.  Include it only where __AVX2__ and __FMA__ are defined.
#pragma once
#include <immintrin.h>

namespace minfer {

static inline __m256 exp_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 gone = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(gone, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

}  // namespace minfer
