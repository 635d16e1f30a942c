// A stand-alone check of one ISA's dot products against the scalar reference,
// for ISAs the test machine cannot run natively (NEON: cross-compiled and run
// under qemu-aarch64 by tests/test_neon_qemu.py).  Same contract as
// tests/test_dot.py: K-quants and IQ4_XS bit-identical to the reference, the other types
// within 2 * (n_terms + 4) * 2^-24 * sum|w_i a_i|.
//
//   usage: dot_check ISA     (prints one line per type, exits 1 on any failure)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "quant/quant.h"

using namespace minfer;

namespace {

// Offsets of the f16 scale fields, set to sane values in random blocks.
std::vector<int> f16_fields(uint32_t t) {
    switch (t) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS:
            return {0};
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: return {0, 2};
        case GGML_TYPE_Q2_K: return {80, 82};
        case GGML_TYPE_Q3_K: return {108};
        case GGML_TYPE_Q6_K: return {208};
        default: return {};
    }
}

std::vector<uint8_t> random_row(std::mt19937& rng, uint32_t t, int n) {
    std::normal_distribution<float> normal;
    const TypeTraits& tt = type_traits(t);
    std::vector<uint8_t> row(row_size(t, n));
    if (t == GGML_TYPE_F32) {
        for (int i = 0; i < n; i++) { float v = normal(rng); std::memcpy(&row[size_t(i) * 4], &v, 4); }
    } else if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
        for (int i = 0; i < n; i++) {
            float v = normal(rng);
            uint16_t h = t == GGML_TYPE_F16 ? f32_to_f16(v) : uint16_t(f32_bits(v) >> 16);
            std::memcpy(&row[size_t(i) * 2], &h, 2);
        }
    } else {
        for (auto& b : row) b = uint8_t(rng());
        std::uniform_real_distribution<float> u(0.5f, 2.0f);
        for (size_t b = 0; b < row.size() / size_t(tt.type_size); b++)
            for (int off : f16_fields(t)) {
                uint16_t h = f32_to_f16(u(rng) / 128.0f);
                std::memcpy(&row[b * size_t(tt.type_size) + size_t(off)], &h, 2);
            }
    }
    return row;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) { std::fprintf(stderr, "usage: dot_check ISA\n"); return 2; }
    Isa isa = Isa::scalar;
    for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon})
        if (std::strcmp(argv[1], isa_name(i)) == 0) isa = i;
    if (!isa_supported(isa)) { std::fprintf(stderr, "ISA %s not available\n", argv[1]); return 2; }
    const DotKernels& simd = dot_kernels(isa);
    const DotKernels& ref = *dot_kernels_scalar();
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal;
    const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                              GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                              GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS};
    int failures = 0;
    for (uint32_t t : types) {
        const bool kquant = type_traits(t).block_size == QK_K;
        const uint32_t at = vec_dot_type(t);
        int checked = 0, bad = 0;
        for (int n : {1536, 8960, 896, 576}) {
            if (n % type_traits(t).block_size || n % type_traits(at).block_size) continue;
            for (int trial = 0; trial < 20; trial++) {
                std::vector<uint8_t> w = random_row(rng, t, n);
                std::vector<float> x((size_t)n), wv((size_t)n), av((size_t)n);
                for (auto& v : x) v = normal(rng) * float(1 + 3 * (trial % 3));
                std::vector<uint8_t> a(row_size(at, n));
                quantize_row_act(at, x.data(), a.data(), n);
                float r = ref.dot[t](n, w.data(), a.data()), s = simd.dot[t](n, w.data(), a.data());
                checked++;
                if (kquant) {
                    if (r != s) bad++;
                    continue;
                }
                dequantize_row(t, w.data(), wv.data(), n);
                dequantize_row(at, a.data(), av.data(), n);
                double S = 0.0;
                for (int i = 0; i < n; i++) S += std::fabs(double(wv[size_t(i)]) * av[size_t(i)]);
                if (t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q5_1) S *= 2;  // the min term counted apart
                const int terms = type_traits(t).block_size == 1 ? n : n / type_traits(t).block_size;
                if (std::fabs(double(r) - s) > 2.0 * (terms + 4) * std::ldexp(1.0, -24) * S) bad++;
            }
        }
        std::printf("%-5s %-6s %d checked, %d bad%s\n", type_traits(t).name, isa_name(isa), checked, bad,
                    kquant ? " (bit-exact required)" : "");
        failures += bad;
    }
    return failures ? 1 : 0;
}
