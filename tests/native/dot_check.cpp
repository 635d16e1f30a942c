// A stand-alone check of one ISA's dot products against the scalar reference,
// for ISAs the test machine cannot run natively (NEON: cross-compiled and run
// under qemu-aarch64 by tests/test_neon_qemu.py).  Same contract as
// tests/test_dot.py: K-quants and IQ4_XS bit-identical to the reference, the other types
// within 2 * (n_terms + 4) * 2^-24 * sum|w_i a_i|.  Then the ISA's attention tiles against
// float64, with a decode row alone equal bit for bit to the same row in a prompt (as
// tests/test_cpu_attention.py checks the x86 ones).
//
//   usage: dot_check ISA     (prints one line per type and one for attention, exits 1 on any failure)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/kernel_choice.h"
#include "backends/kv_format.h"
#include "common/half.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"

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

// Attention on the ISA's tiles (heads 8 over 2 of 64, an f16 cache of 300 positions, the last 20 as a prompt)
// against float64 over the stored values; then rows 0, 7 and 19 alone.  Returns the bad values.
int attention_check(Isa isa, std::mt19937& rng) {
    const int n_head = 8, n_kv = 2, hd = 64, n_ctx = 300, rows = 20, dim = n_kv * hd, qd = n_head * hd;
    std::normal_distribution<float> normal;
    std::vector<float> q(size_t(rows * qd)), k(size_t(n_ctx * dim)), v(size_t(n_ctx * dim));
    for (auto& x : q) x = normal(rng);
    for (auto& x : k) x = 2 * normal(rng);
    for (auto& x : v) x = normal(rng);
    const KvLayout kv{GGML_TYPE_F16, dim, n_ctx};
    std::vector<uint8_t> kc(kv_row_bytes(GGML_TYPE_F16, dim) * n_ctx), vc(kc.size());
    std::vector<int32_t> all(n_ctx), pos(rows);
    for (int j = 0; j < n_ctx; j++) all[size_t(j)] = j;
    for (int r = 0; r < rows; r++) pos[size_t(r)] = n_ctx - rows + r;
    cpu_kv_store(k.data(), dim, v.data(), dim, n_ctx, all.data(), kc.data(), vc.data(), kv);
    ThreadPool pool(2);
    force_kernel("cpu.attention", "tiles");
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> out(size_t(rows) * size_t(qd)), one(static_cast<size_t>(qd));
    cpu_attention(q.data(), qd, out.data(), qd, rows, pos.data(), kc.data(), vc.data(), kv, n_head, n_kv, hd, scale, 0,
                  pool, isa);
    int bad = 0;
    auto f16 = [](float x) { return double(f16_to_f32(f32_to_f16(x))); };
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < n_head; h++) {
            const int g = h / (n_head / n_kv);
            std::vector<double> s(size_t(pos[size_t(r)] + 1));
            double mx = -1e300, sum = 0;
            for (int j = 0; j <= pos[size_t(r)]; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += double(q[size_t(r * qd + h * hd + i)]) * f16(k[size_t(j * dim + g * hd + i)]);
                s[size_t(j)] = d * scale, mx = std::max(mx, s[size_t(j)]);
            }
            for (auto& x : s) sum += (x = std::exp(x - mx));
            for (int i = 0; i < hd; i++) {
                double y = 0;
                for (int j = 0; j <= pos[size_t(r)]; j++) y += s[size_t(j)] / sum * f16(v[size_t(j * dim + g * hd + i)]);
                if (std::fabs(y - out[size_t(r * qd + h * hd + i)]) > 1e-5 * (1 + std::fabs(y))) bad++;
            }
        }
    for (int r : {0, 7, 19}) {
        cpu_attention(q.data() + r * qd, qd, one.data(), qd, 1, pos.data() + r, kc.data(), vc.data(), kv, n_head, n_kv,
                      hd, scale, 0, pool, isa);
        if (std::memcmp(one.data(), out.data() + r * qd, size_t(qd) * 4) != 0) bad++;
    }
    std::printf("attn  %-6s %d checked, %d bad (kernel %s)\n", isa_name(isa), rows * qd + 3, bad,
                cpu_attention_kernel(GGML_TYPE_F16, hd, isa));
    return bad;
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
    failures += attention_check(isa, rng);
    return failures ? 1 : 0;
}
