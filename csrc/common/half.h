// IEEE half (f16) and bfloat16 <-> f32 conversions, in portable C++.
// These are the scalar definitions; SIMD kernels use F16C / AVX-512 instructions
// that give identical results.  `static inline` on purpose: this header is
// included by translation units compiled with different -m flags, and a
// non-static inline function could be merged across them (ODR) and leak
// AVX-512 code into the scalar path.
#pragma once
#include <cstdint>
#include <cstring>

namespace minfer {

static inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Exact: every f16 value is representable in f32.
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // inf / nan
    if (exp == 0) {
        if (man == 0) return f32_from_bits(sign);                               // +-0
        // subnormal: man * 2^-24, exact in f32
        float v = float(man) * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

// Round to nearest, ties to even (what numpy's astype(float16) and F16C do).
static inline uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or nan (keep nan quiet)
        return uint16_t(sign | 0x7c00 | (ax > 0x7f800000u ? (0x200 | ((ax >> 13) & 0x3ff)) : 0));
    }
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: overflow to inf
    if (ax < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
        // value / 2^-24 rounded to nearest even gives the subnormal mantissa
        if (ax < 0x33000000u) return uint16_t(sign);  // < 2^-25: rounds to zero
        uint32_t e = ax >> 23;                         // biased f32 exponent
        uint32_t m = (ax & 0x7fffff) | 0x800000;       // 24-bit significand
        uint32_t shift = 126 - e;                      // so that result = m >> (shift) ~ value*2^24
        // value = m * 2^(e-150); mantissa = value * 2^24 = m * 2^(e-126) = m >> (126-e)
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return uint16_t(sign | q);
    }
    // normal: rebias exponent, round 23-bit mantissa to 10 bits
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1);  // ties to even
    r -= 0x38000000u;                            // (127-15) << 23
    return uint16_t(sign | (r >> 13));
}

static inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

}  // namespace minfer
