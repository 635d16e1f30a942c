#include "quant/types.h"

namespace minfer {

namespace {
// Indexed by type id.  Sizes are ggml's; ids 4, 5 (removed Q4_2/Q4_3) and
// 31..33, 36..38 (removed or never released) are unknown.
const TypeTraits kTraits[GGML_TYPE_COUNT] = {
    {"F32", 1, 4, true},      {"F16", 1, 2, true},      {"Q4_0", 32, 18, true},
    {"Q4_1", 32, 20, true},   {"(4)", 0, 0, false},     {"(5)", 0, 0, false},
    {"Q5_0", 32, 22, true},   {"Q5_1", 32, 24, true},   {"Q8_0", 32, 34, true},
    {"Q8_1", 32, 36, true},   {"Q2_K", 256, 84, true},  {"Q3_K", 256, 110, true},
    {"Q4_K", 256, 144, true}, {"Q5_K", 256, 176, true}, {"Q6_K", 256, 210, true},
    {"Q8_K", 256, 292, true}, {"IQ2_XXS", 256, 66, true}, {"IQ2_XS", 256, 74, true},
    {"IQ3_XXS", 256, 98, true}, {"IQ1_S", 256, 50, true}, {"IQ4_NL", 32, 18, true},
    {"IQ3_S", 256, 110, true}, {"IQ2_S", 256, 82, true}, {"IQ4_XS", 256, 136, true},
    {"I8", 1, 1, true},       {"I16", 1, 2, true},      {"I32", 1, 4, true},
    {"I64", 1, 8, true},      {"F64", 1, 8, true},      {"IQ1_M", 256, 56, true},
    {"BF16", 1, 2, true},     {"(31)", 0, 0, false},    {"(32)", 0, 0, false},
    {"(33)", 0, 0, false},    {"TQ1_0", 256, 54, true}, {"TQ2_0", 256, 66, true},
    {"(36)", 0, 0, false},    {"(37)", 0, 0, false},    {"(38)", 0, 0, false},
    {"MXFP4", 32, 17, true},  {"NVFP4", 64, 36, true},  {"Q1_0", 128, 18, true},
};
const TypeTraits kUnknown = {"(unknown)", 0, 0, false};
}  // namespace

const TypeTraits& type_traits(uint32_t type) {
    return type < GGML_TYPE_COUNT ? kTraits[type] : kUnknown;
}

uint32_t vec_dot_type(uint32_t t) {
    switch (t) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL: return GGML_TYPE_Q8_0;
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: return GGML_TYPE_Q8_1;
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_IQ4_XS: return GGML_TYPE_Q8_K;
        default: return GGML_TYPE_F32;  // F32, F16, BF16
    }
}

}  // namespace minfer
