// The quantization layer: dequantization, quantizers, and the per-ISA table of
// dot-product kernels that the matrix products are built on.
#pragma once
#include <cstdint>

#include "quant/types.h"

namespace minfer {

// y[0..n) = the values a row of `type` encodes.  Bit-exact with ggml.
void dequantize_row(uint32_t type, const void* x, float* y, int64_t n);

// Reference quantizers (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and F32/F16/BF16), bit-exact
// with ggml's quantize_row_*_ref and the `gguf` package.  Used to make test models.
void quantize_row_ref(uint32_t type, const float* x, void* y, int64_t n);

// Activation quantizers: the row of activations a weight type's dot product
// consumes (Q8_0, Q8_1, Q8_K; F32 copies).  `type` is the activation type.
void quantize_row_act(uint32_t type, const float* x, void* y, int64_t n);

// 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K.
static inline void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Signed 6-bit scale of sub-block j (0..15) of Q3_K: low 4 bits from bytes 0..7
// (nibble j / 8), high 2 bits from bytes 8..11 (2-bit field j / 4), minus 32.
static inline int q3_K_scale(const uint8_t* s, int j) {
    int lo = (s[j % 8] >> (4 * (j / 8))) & 0xf;
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

// dot(weight row, activation row) over n values; the activation row is in
// vec_dot_type(weight type).
typedef float (*vec_dot_fn)(int64_t n, const void* w, const void* a);

// The GEMM's unit: one weight row against n_tok (1, 2, 4 or 8) activation rows
// `stride` bytes apart, into out[0..n_tok).  `scales` holds what
// act_scales() makes of each activation row (its f16 block scales in f32, so
// they are converted once per matrix, not once per weight row), rows
// `scales_stride` floats apart.  Bit-identical to the same ISA's vec_dot_fn.
typedef void (*vec_dot_rows_fn)(int64_t n, const void* w, const void* a, size_t stride, const float* scales,
                                size_t scales_stride, int n_tok, float* out);
// The GEMM's wider unit, where an ISA has one: four weight rows
// (`w_stride` bytes apart) against n_tok (1, 2, 4 or 8; 16 where DotKernels::tile16) activation rows, into
// out[k * 4 + r] (token k, weight row r).  Bit-identical to vec_dot_rows_fn
// and vec_dot_fn of the same ISA on each row, so that which unit the GEMM's
// tiling picks never changes a result.  `stream`: this is the caller's first
// pass over these rows (they come from memory) and the next four rows follow:
// the kernel prefetches them (the hardware prefetcher misses four short streams
// side by side); on later passes the rows sit in cache and it does not.
typedef void (*vec_dot_tile4_fn)(int64_t n, const void* w, size_t w_stride, const void* a, size_t stride,
                                 const float* scales, size_t scales_stride, int n_tok, bool stream, float* out);
// The same over eight weight rows (AVX-512 VNNI: one 512-bit product a token for all eight), 2, 4, 8 or 16
// tokens, into out[k * 8 + r]; the same bits as the four-row unit on each row.
typedef vec_dot_tile4_fn vec_dot_tile8_fn;
// Floats act_scales writes per activation row of n values (0 where the format needs none).
int64_t act_scale_count(uint32_t act_type, int64_t n);
// Q8_0: d, then the int32 sums of its values 0-3 mod 8 and 4-7 mod 8 (their bits), per block; Q8_1: d, s
// per block (f16 -> f32, exact).  The sums let a VNNI tile multiply unsigned (biased) weights.
void act_scales(uint32_t act_type, const void* a, int64_t n, float* out);

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2, neon = 3 };
const char* isa_name(Isa isa);

// An activation quantizer: quantize_row_act's signature and bytes.
typedef void (*act_quantize_fn)(uint32_t type, const float* x, void* y, int64_t n);
// The FFN gate over n values: y = silu(g) * u = g u / (1 + e^-g) (y may be g or u).
typedef void (*swiglu_fn)(const float* g, const float* u, float* y, int64_t n);
void swiglu_row_ref(const float* g, const float* u, float* y, int64_t n);  // with std::exp
// gemma's gate, GELU in its tanh form: y = gelu(g) * u = g u / (1 + e^(-2z)), z = sqrt(2/pi) (g + 0.044715 g^3)
// (0.5 (1 + tanh z) = 1 / (1 + e^(-2z))); same signature.
void geglu_row_ref(const float* g, const float* u, float* y, int64_t n);  // with std::exp

struct DotKernels {
    Isa isa;
    act_quantize_fn quantize;           // quantize_row_act, or this ISA's faster one (the same bytes)
    swiglu_fn swiglu;                   // swiglu_row_ref, or this ISA's (both within 4 ulp of float64)
    swiglu_fn geglu;                    // geglu_row_ref, or this ISA's
    vec_dot_fn dot[GGML_TYPE_COUNT];    // nullptr where the weight type has no kernel
    vec_dot_rows_fn rows[GGML_TYPE_COUNT];  // nullptr where there is none (the GEMM calls dot)
    vec_dot_tile4_fn tile4[GGML_TYPE_COUNT];  // nullptr where there is none (the GEMM calls rows)
    bool tile16[GGML_TYPE_COUNT];             // the tile also takes 16 tokens (its rows unpacked once for them)
    vec_dot_tile8_fn tile8[GGML_TYPE_COUNT];  // nullptr where there is none (2-16 tokens; 16 where tile16)
};

// One ISA's kernels, in the order of the table below (weights x activations).
struct DotFns {
    vec_dot_fn f32, f16, bf16;                  // x f32
    vec_dot_fn q4_0, q5_0, q8_0;                // x Q8_0
    vec_dot_fn q4_1, q5_1;                      // x Q8_1
    vec_dot_fn q2_K, q3_K, q4_K, q5_K, q6_K;    // x Q8_K
    vec_dot_fn iq4_nl, iq4_xs;                  // x Q8_0, x Q8_K
};
DotKernels make_dot_table(Isa isa, const DotFns& f);
// Every ISA file defines this kernel set under these names (in an anonymous namespace).
#define MINFER_DOT_FNS                                                                                  \
    {dot_f32_f32,   dot_f16_f32,   dot_bf16_f32,  dot_q4_0_q8_0, dot_q5_0_q8_0, dot_q8_0_q8_0, dot_q4_1_q8_1, \
     dot_q5_1_q8_1, dot_q2_K_q8_K, dot_q3_K_q8_K, dot_q4_K_q8_K, dot_q5_K_q8_K, dot_q6_K_q8_K, dot_iq4_nl_q8_0,   \
     dot_iq4_xs_q8_K}

// Per-ISA tables; a table for an ISA this build or CPU lacks is nullptr.
const DotKernels* dot_kernels_scalar();
const DotKernels* dot_kernels_avx2();
const DotKernels* dot_kernels_avx512();
const DotKernels* dot_kernels_neon();

// The table for `isa`, or an error naming why it is unavailable here.
const DotKernels& dot_kernels(Isa isa);
// The best ISA this CPU supports, unless MINFER_CPU_ISA=scalar|avx2|avx512|neon says otherwise.
Isa default_isa();
bool isa_supported(Isa isa);  // compiled in and supported by this CPU

}  // namespace minfer
