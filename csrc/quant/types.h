// ggml tensor types and the block layouts of the quantized ones.
//
// A quantized row of n values is n / block_size blocks laid out back to back.
// The layouts are ggml's (they are what GGUF files contain); the comment on each
// struct gives its size and how one value is reconstructed.
#pragma once
#include <cstddef>
#include <cstdint>

namespace minfer {

// Type ids as stored in GGUF tensor infos (ggml_type).
enum GGMLType : uint32_t {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 42,  // one past the largest id the reader knows (see type_traits)
};

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
constexpr int QK_K = 256;          // super-block of the K-quants
constexpr int K_SCALE_SIZE = 12;   // packed 6-bit scales/mins of Q4_K and Q5_K

// x[i] = d * (q[i] - 8); q is 4 bits, element i < 16 in the low nibble of qs[i],
// element i + 16 in the high nibble.                                    18 bytes
struct block_q4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
// x[i] = d * q[i] + m                                                     20 bytes
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };
// x[i] = d * (q[i] - 16); bit 4 of q[i] is bit i of qh                   22 bytes
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
// x[i] = d * q[i] + m                                                     24 bytes
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
// x[i] = d * qs[i]                                                        34 bytes
struct block_q8_0 { uint16_t d; int8_t qs[QK8_0]; };
// activations for Q4_1/Q5_1: x[i] = d * qs[i]; s = d * sum(qs)            36 bytes
struct block_q8_1 { uint16_t d, s; int8_t qs[QK8_1]; };

// K-quants: 256 values in 16 (or 8) sub-blocks with their own scales.
// x = d * sc[j] * q - dmin * m[j]; q in 0..3; scales[j] = sc | m << 4     84 bytes
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
// x = d * (sc[j] - 32) * (q - 4 * !hbit); q 2 bits, 6-bit scales        110 bytes
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
// x = d * sc[j] * q - dmin * m[j]; 8 sub-blocks of 32, q 4 bits          144 bytes
struct block_q4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
// as Q4_K with a 5th bit from qh                                         176 bytes
struct block_q5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
// x = d * sc[j] * (q - 32); 16 sub-blocks of 16, q 6 bits, sc int8       210 bytes
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
// activations for the K-quants: x = d * qs; bsums[j] = sum of qs[16j..16j+16)
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };  // 292 bytes

// The "non-linear" 4-bit types: a 4-bit index into a fixed table of 16 signed levels (denser near zero),
// x = d * kvalues_iq4nl[q].  IQ4_NL: blocks of 32, element i < 16 in the low nibble of qs[i], i + 16 in
// the high nibble (Q4_0's order).                                          18 bytes
struct block_iq4_nl { uint16_t d; uint8_t qs[QK4_0 / 2]; };
// IQ4_XS: 256 values in 8 sub-blocks of 32, each with a 6-bit scale ls (low 4 bits: nibble j % 2 of
// scales_l[j / 2]; high 2 bits: bits 2j of scales_h): x = d * (ls - 32) * kvalues_iq4nl[q]; sub-block j's
// nibbles in qs[16j..16j+16) in IQ4_NL's order.                           136 bytes
struct block_iq4_xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};
// The 6-bit scale of IQ4_XS sub-block j, minus 32.
inline int iq4_xs_scale(const block_iq4_xs& b, int j) {
    return (((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}

static_assert(sizeof(block_iq4_nl) == 18 && sizeof(block_iq4_xs) == 136, "layout");
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20, "layout");
static_assert(sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24, "layout");
static_assert(sizeof(block_q8_0) == 34 && sizeof(block_q8_1) == 36, "layout");
static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110, "layout");
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176, "layout");
static_assert(sizeof(block_q6_K) == 210 && sizeof(block_q8_K) == 292, "layout");

// Size facts for every type id a GGUF file may hold.  `known` is false for ids
// ggml never assigned (or has removed); such a tensor makes a file invalid.
struct TypeTraits {
    const char* name;
    int block_size;    // values per block
    int type_size;     // bytes per block
    bool known;
};
const TypeTraits& type_traits(uint32_t type);  // any id; unknown ids give known=false

// Bytes of a row of n values; n must be a multiple of the block size.
inline size_t row_size(uint32_t type, int64_t n) {
    const TypeTraits& t = type_traits(type);
    return size_t(n / t.block_size) * size_t(t.type_size);
}

// The activation type a weight type's dot product consumes (F32 for float weights).
uint32_t vec_dot_type(uint32_t weight_type);

}  // namespace minfer
