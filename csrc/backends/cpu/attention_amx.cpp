// Attention on AMX tiles: scores as K Q^T and the output as P V, 16 x 16 f32 tiles accumulated from bf16
// products.  Every operand is cut into bf16 pieces whose sum is the operand exactly (an f16 key or value in
// two, an f32 query or probability in three) and the products that matter are all taken (the dropped ones
// are below 2^-24 of the largest), so the tiles' sums carry f32's precision at a fraction of the f32 FMAs'
// time.  The softmax between the two products is the f32 kernel's.
//
// A row's arithmetic depends only on itself: chunks of keys start at multiples of 64, keys a row does not
// see enter its sums as exact zeros, and each tile element sums its pieces in one fixed order, so decode
// rows, prompt rows and any cut of the work into tasks give the same bits.
#include "backends/cpu/attention_task.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"

#if defined(MINFER_HAVE_AMX)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace minfer {

#if defined(MINFER_HAVE_AMX)
namespace {

constexpr int kKeys = 64;  // a chunk of keys: 4 groups of 16 for the scores, 2 steps of 32 for the sums
constexpr int kSteps = kKeys / 32;

// Linux hands a process the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
bool tiles_granted() {
    static const bool granted = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
        const bool amx = (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
        if (!amx || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return false;
        return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }();
    return granted;
}

// Eight tiles of 16 rows x 64 bytes: 0-3 accumulate, 4-5 hold A operands, 6-7 B operands.
void configure_tiles() {
    struct alignas(64) {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg{};
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
}

// x with its low 16 bits cleared: a bf16 value, and x minus it is exact
inline __m512 top16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0xFFFF0000u))));
}

// 32 floats that are bf16 values (a: the first 16) as 32 bf16 words
inline __m512i pack_bf16(__m512 a, __m512 b) {
    alignas(64) static const uint16_t odd[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                 33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
    return _mm512_permutex2var_epi16(_mm512_castps_si512(a), _mm512_load_si512(odd), _mm512_castps_si512(b));
}

// 16 pairs of bf16 values as 16 dwords, a's in the low word (a B operand's key pair)
inline __m512i pair_bf16(__m512 a, __m512 b) {
    return _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(a), 16),
                           _mm512_and_si512(_mm512_castps_si512(b), _mm512_set1_epi32(int(0xFFFF0000u))));
}

// Lanes of keys k0..k0+15 inside [lo, hi).
inline __mmask16 key_mask(int k0, int lo, int hi) {
    const int b = std::clamp(lo - k0, 0, 16), e = std::clamp(hi - k0, 0, 16);
    return b < e ? __mmask16(((1u << e) - 1) & ~((1u << b) - 1)) : __mmask16(0);
}

inline __m512 f16x16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }

// An f16 row as two bf16 rows, hi + lo = the row exactly (f16's 11 significant bits: 8 and 3).
void split_f16_row(const uint16_t* src, int hd, uint16_t* hi, uint16_t* lo) {
    for (int d = 0; d < hd; d += 32) {
        const __m512 a = f16x16(src + d), b = f16x16(src + d + 16);
        const __m512 ah = top16(a), bh = top16(b);
        _mm512_store_si512(hi + d, pack_bf16(ah, bh));
        _mm512_store_si512(lo + d, pack_bf16(_mm512_sub_ps(a, ah), _mm512_sub_ps(b, bh)));
    }
}

// Two f16 rows (null: zeros) as the key pair row of each 16-dim B operand: dim group dg at hi/lo + dg * 256.
void split_f16_pair(const uint16_t* va, const uint16_t* vb, int hd, uint32_t* hi, uint32_t* lo) {
    for (int dg = 0; dg < hd / 16; dg++) {
        const __m512 a = va ? f16x16(va + 16 * dg) : _mm512_setzero_ps();
        const __m512 b = vb ? f16x16(vb + 16 * dg) : _mm512_setzero_ps();
        const __m512 ah = top16(a), bh = top16(b);
        _mm512_store_si512(hi + 256 * dg, pair_bf16(ah, bh));
        _mm512_store_si512(lo + 256 * dg, pair_bf16(_mm512_sub_ps(a, ah), _mm512_sub_ps(b, bh)));
    }
}

// An f32 value as three bf16 pieces (hi + mid + lo = x exactly), as bf16 words.
void split3(float x, uint16_t* p) {
    auto bits = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; };
    auto val = [](uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
    const uint32_t h = bits(x) & 0xFFFF0000u;
    const float r = x - val(h);
    const uint32_t m = bits(r) & 0xFFFF0000u;
    p[0] = uint16_t(h >> 16), p[1] = uint16_t(m >> 16), p[2] = uint16_t(bits(r - val(m)) >> 16);
}

// 16 x 16 floats transposed (in: rows of 16 at in[i * 16]), scaled, rows stored under a key mask.
void store_transposed(const float* in, float scale, float* const* rows, __mmask16 keys, int n_rows) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(in + 16 * i);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int k = 0; k < 2; k++) {
            r[i + k] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + k]), _mm512_castps_pd(t[i + k + 2])));
            r[i + k + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + k]), _mm512_castps_pd(t[i + k + 2])));
        }
    for (int i = 0; i < 16; i += 8)
        for (int k = 0; k < 4; k++) {
            t[i + k] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0x88);
            t[i + k + 4] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
    // r[j] now holds column kCol[j] of the input (the unpacks leave columns 1 and 2 of each four swapped)
    static constexpr int kCol[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    const __m512 s = _mm512_set1_ps(scale);
    for (int j = 0; j < 16; j++)
        if (kCol[j] < n_rows) _mm512_mask_storeu_ps(rows[kCol[j]], keys, _mm512_mul_ps(r[j], s));
}

// Tile ids are immediates (GCC's intrinsics paste them into the instruction): each step exists for each of
// the four accumulator tiles, picked from a table.
//  scores: C += K Q^T for one 32-dim step; A = the keys' hi / lo pieces (tiles 4, 5, loaded), B = the queries'
//          three pieces
//  sums:   C += P V for one 32-key step; B = the values' hi / lo pieces (tiles 6, 7, loaded), A = P's three
#define AMX_STEPS(C)                                                                  \
    void scores_step_##C(const void* qh, const void* qm, const void* ql) {                   \
        _tile_loadd(6, qh, 64);                                                              \
        _tile_loadd(7, qm, 64);                                                              \
        _tile_dpbf16ps(C, 4, 6);                                                             \
        _tile_dpbf16ps(C, 5, 6);                                                             \
        _tile_dpbf16ps(C, 4, 7);                                                             \
        _tile_dpbf16ps(C, 5, 7);                                                             \
        _tile_loadd(6, ql, 64);                                                              \
        _tile_dpbf16ps(C, 4, 6);                                                             \
    }                                                                                        \
    void sums_step_##C(const void* ph, const void* pm, const void* pl, int stride) {         \
        _tile_loadd(4, ph, stride);                                                          \
        _tile_loadd(5, pm, stride);                                                          \
        _tile_dpbf16ps(C, 4, 6);                                                             \
        _tile_dpbf16ps(C, 4, 7);                                                             \
        _tile_dpbf16ps(C, 5, 6);                                                             \
        _tile_dpbf16ps(C, 5, 7);                                                             \
        _tile_loadd(4, pl, stride);                                                          \
        _tile_dpbf16ps(C, 4, 6);                                                             \
    }                                                                                        \
    void zero_##C() { _tile_zero(C); }                                                       \
    void load_##C(const void* p, int stride) { _tile_loadd(C, p, stride); }                  \
    void store_##C(void* p, int stride) { _tile_stored(C, p, stride); }
AMX_STEPS(0)
AMX_STEPS(1)
AMX_STEPS(2)
AMX_STEPS(3)
#undef AMX_STEPS
void (*const scores_step[4])(const void*, const void*, const void*) = {scores_step_0, scores_step_1, scores_step_2,
                                                                         scores_step_3};
void (*const sums_step[4])(const void*, const void*, const void*, int) = {sums_step_0, sums_step_1, sums_step_2,
                                                                          sums_step_3};
void (*const tile_zero[4])() = {zero_0, zero_1, zero_2, zero_3};
void (*const tile_load[4])(const void*, int) = {load_0, load_1, load_2, load_3};
void (*const tile_store[4])(void*, int) = {store_0, store_1, store_2, store_3};

// per-thread scratch, 64-byte aligned pieces of one buffer
struct Scratch {
    std::vector<uint8_t> buf;
    size_t used = 0;
    void reset(size_t bytes) {
        if (buf.size() < bytes + 64 * 16) buf.resize(bytes + 64 * 16);
        used = 0;
    }
    template <class T> T* take(size_t n) {
        uint8_t* base = buf.data() + used;
        base += (64 - uintptr_t(base) % 64) % 64;
        used = size_t(base - buf.data()) + n * sizeof(T);
        return (T*)base;
    }
};

}  // namespace

bool amx_attention_fits(uint32_t kv_type, int head_dim) {
    return kv_type == GGML_TYPE_F16 && head_dim % 32 == 0 && head_dim <= 256 && tiles_granted();
}

void amx_attention_task(const AttnTask& t) {
    const int hd = t.head_dim, nh = t.h1 - t.h0, KS = hd / 32, DG = hd / 16;
    const int M = int(t.r1 - t.r0) * nh, QG = (M + 15) / 16, span = t.n_keys - t.k_lo;
    const size_t slice0 = size_t(t.g) * size_t(hd) * 2;  // the KV head's bytes in a cache row

    thread_local Scratch mem;
    thread_local std::vector<float> S;
    mem.reset(size_t(3 * KS * QG) * 1024 + size_t(2 * kKeys * hd) * 2 + size_t(2 * kSteps * DG) * 1024 +
              size_t(3 * QG * 16 * kKeys) * 2 + size_t(QG * 16 * hd) * 4 + 4 * 1024 + size_t(M) * 4 + 16 * 64);
    uint32_t* Qp = mem.take<uint32_t>(size_t(3 * KS * QG) * 256);  // [piece][step][qg][pair][query]
    uint16_t* Kp = mem.take<uint16_t>(size_t(2 * kKeys * hd));     // [piece][key][dim]
    uint32_t* Vp = mem.take<uint32_t>(size_t(2 * kSteps * DG) * 256);       // [piece][step][dg][pair][dim]
    uint16_t* Pp = mem.take<uint16_t>(size_t(3 * QG * 16 * kKeys));      // [piece][qg][query][key]
    float* O = mem.take<float>(size_t(QG * 16) * size_t(hd));      // [query][dim], unnormalized
    float* Ct = mem.take<float>(4 * 256);
    float* inv = mem.take<float>(size_t(M));
    S.resize(size_t(M) * size_t(span));  // [query][key], key j at j - k_lo
    auto query_row = [&](int m) { return t.r0 + m / nh; };
    auto query_head = [&](int m) { return t.h0 + m % nh; };

    configure_tiles();
    // the queries as B operands: three pieces, each step's 16 dim pairs x 16 queries (absent queries 0)
    std::memset(Qp, 0, size_t(3 * KS * QG) * 1024);
    for (int m = 0; m < M; m++) {
        const float* q = t.q + query_row(m) * t.q_ld + int64_t(query_head(m)) * hd;
        for (int d = 0; d < hd; d++) {
            uint16_t p[3];
            split3(q[d], p);
            for (int k = 0; k < 3; k++) {
                uint16_t* w = (uint16_t*)(Qp + (size_t(k * KS + d / 32) * size_t(QG) + size_t(m / 16)) * 256 +
                                          size_t(d % 32 / 2) * 16 + size_t(m % 16));
                w[d % 2] = p[k];
            }
        }
    }
    auto q_tile = [&](int piece, int s, int qg) { return Qp + (size_t(piece * KS + s) * size_t(QG) + size_t(qg)) * 256; };

    // scores: chunk by chunk, the keys converted once, a batch of four (key group, query group) tiles at once
    std::vector<std::pair<int, int>> jobs;
    for (int j0 = t.k_lo / kKeys * kKeys; j0 < t.n_keys; j0 += kKeys) {
        const int a = std::max(j0, t.k_lo), e = std::min(j0 + kKeys, t.n_keys);
        for (int j = j0; j < j0 + kKeys; j++) {
            uint16_t* hi = Kp + size_t(j - j0) * size_t(hd);
            if (j >= a && j < e) {
                if (j + kKeys < t.n_keys)
                    for (int b = 0; b < hd * 2; b += 64) __builtin_prefetch(t.key(t.k_cache, j + kKeys) + slice0 + b, 0, 2);
                split_f16_row((const uint16_t*)(t.key(t.k_cache, j) + slice0), hd, hi, hi + kKeys * hd);
            } else if ((j - j0) / 16 >= (a - j0) / 16 && (j - j0) / 16 <= (e - 1 - j0) / 16) {
                std::memset(hi, 0, size_t(hd) * 2), std::memset(hi + kKeys * hd, 0, size_t(hd) * 2);
            }
        }
        jobs.clear();
        for (int kg = (a - j0) / 16; kg <= (e - 1 - j0) / 16; kg++)
            for (int qg = 0; qg < QG; qg++) jobs.push_back({kg, qg});
        for (size_t b0 = 0; b0 < jobs.size(); b0 += 4) {
            const int nb = int(std::min<size_t>(4, jobs.size() - b0));
            for (int b = 0; b < nb; b++) tile_zero[b]();
            for (int s = 0; s < KS; s++)
                for (int b = 0; b < nb; b++) {
                    const auto [kg, qg] = jobs[b0 + size_t(b)];
                    if (b == 0 || kg != jobs[b0 + size_t(b) - 1].first) {
                        _tile_loadd(4, Kp + size_t(kg * 16) * size_t(hd) + size_t(s * 32), hd * 2);
                        _tile_loadd(5, Kp + size_t(kKeys + kg * 16) * size_t(hd) + size_t(s * 32), hd * 2);
                    }
                    scores_step[b](q_tile(0, s, qg), q_tile(1, s, qg), q_tile(2, s, qg));
                }
            for (int b = 0; b < nb; b++) {
                const auto [kg, qg] = jobs[b0 + size_t(b)];
                tile_store[b](Ct + 256 * b, 64);
                const int k0 = j0 + kg * 16;  // keys k0..k0+15 of queries qg*16..
                const __mmask16 keys = key_mask(k0, a, e);
                float* rows[16] = {};
                for (int c = 0; c < 16 && qg * 16 + c < M; c++)
                    rows[c] = S.data() + size_t(qg * 16 + c) * size_t(span) + (k0 - t.k_lo);
                store_transposed(Ct + 256 * b, t.scale, rows, keys, std::min(16, M - qg * 16));
            }
        }
    }
    for (int m = 0; m < M; m++) {
        const int64_t r = query_row(m);
        inv[m] = softmax_unnormalized(S.data() + size_t(m) * size_t(span) + (t.first_key(r) - t.k_lo),
                                      t.pos[r] + 1 - t.first_key(r));
    }

    // weighted sums: chunk by chunk, P and V in pieces, a batch of four (dim group, query group) tiles at once
    std::memset(O, 0, size_t(QG * 16) * size_t(hd) * 4);
    const size_t piece = size_t(QG * 16 * kKeys);  // P's pieces one after the other
    for (int m = M; m < QG * 16; m++)  // the last tile's absent queries: 0 throughout
        for (int k = 0; k < 3; k++) std::memset(Pp + k * piece + size_t(m) * kKeys, 0, kKeys * 2);
    for (int j0 = t.k_lo / kKeys * kKeys; j0 < t.n_keys; j0 += kKeys) {
        const int a = std::max(j0, t.k_lo), e = std::min(j0 + kKeys, t.n_keys);
        const int s0 = (a - j0) / 32, s1 = (e - 1 - j0) / 32;  // the 32-key steps with keys
        for (int s = s0; s <= s1; s++)
            for (int p = 0; p < 16; p++) {
                const int ja = j0 + 32 * s + 2 * p, jb = ja + 1;
                if (jb + kKeys < t.n_keys)
                    for (int b = 0; b < hd * 2; b += 64) {
                        __builtin_prefetch(t.key(t.v_cache, ja + kKeys) + slice0 + b, 0, 2);
                        __builtin_prefetch(t.key(t.v_cache, jb + kKeys) + slice0 + b, 0, 2);
                    }
                auto row = [&](int j) {
                    return j >= a && j < e ? (const uint16_t*)(t.key(t.v_cache, j) + slice0) : nullptr;
                };
                split_f16_pair(row(ja), row(jb), hd, Vp + size_t(s * DG) * 256 + size_t(p) * 16,
                               Vp + size_t((kSteps + s) * DG) * 256 + size_t(p) * 16);
            }
        // P's pieces for the chunk: a row's keys outside [first key, position] are 0
        for (int m = 0; m < M; m++) {
            uint16_t* dst = Pp + size_t(m) * kKeys;
            const int64_t r = query_row(m);
            const int lo = std::max(a, t.first_key(r)), hi = std::min(e, t.pos[r] + 1);
            const float* srow = S.data() + size_t(m) * size_t(span) - t.k_lo;
            for (int s = 0; s < kSteps; s++) {
                __m512 x[2];
                for (int h = 0; h < 2; h++) {
                    const int k0 = j0 + 32 * s + 16 * h;
                    const __mmask16 keys = key_mask(k0, lo, hi);
                    x[h] = keys ? _mm512_maskz_loadu_ps(keys, srow + k0) : _mm512_setzero_ps();
                }
                const __m512 h0 = top16(x[0]), h1 = top16(x[1]);
                const __m512 r0 = _mm512_sub_ps(x[0], h0), r1 = _mm512_sub_ps(x[1], h1);
                const __m512 m0 = top16(r0), m1 = top16(r1);
                _mm512_store_si512(dst + 32 * s, pack_bf16(h0, h1));
                _mm512_store_si512(dst + piece + 32 * s, pack_bf16(m0, m1));
                _mm512_store_si512(dst + 2 * piece + 32 * s,
                                   pack_bf16(_mm512_sub_ps(r0, m0), _mm512_sub_ps(r1, m1)));
            }
        }
        jobs.clear();
        for (int dg = 0; dg < DG; dg++)
            for (int qg = 0; qg < QG; qg++) jobs.push_back({dg, qg});
        for (size_t b0 = 0; b0 < jobs.size(); b0 += 4) {
            const int nb = int(std::min<size_t>(4, jobs.size() - b0));
            auto o_tile = [&](int b) {
                const auto [dg, qg] = jobs[b0 + size_t(b)];
                return O + size_t(qg * 16) * size_t(hd) + size_t(dg * 16);
            };
            for (int b = 0; b < nb; b++) tile_load[b](o_tile(b), hd * 4);
            for (int s = s0; s <= s1; s++)
                for (int b = 0; b < nb; b++) {
                    const auto [dg, qg] = jobs[b0 + size_t(b)];
                    if (b == 0 || dg != jobs[b0 + size_t(b) - 1].first) {
                        _tile_loadd(6, Vp + size_t(s * DG + dg) * 256, 64);
                        _tile_loadd(7, Vp + size_t((kSteps + s) * DG + dg) * 256, 64);
                    }
                    const uint16_t* p = Pp + size_t(qg * 16 * kKeys + 32 * s);
                    sums_step[b](p, p + piece, p + 2 * piece, kKeys * 2);
                }
            for (int b = 0; b < nb; b++) tile_store[b](o_tile(b), hd * 4);
        }
    }
    _tile_release();
    for (int m = 0; m < M; m++) {
        float* y = t.out + query_row(m) * t.out_ld + int64_t(query_head(m)) * hd;
        const __m512 f = _mm512_set1_ps(inv[m]);
        for (int d = 0; d < hd; d += 16)
            _mm512_storeu_ps(y + d, _mm512_mul_ps(_mm512_load_ps(O + size_t(m) * size_t(hd) + size_t(d)), f));
    }
}

#else  // a build without AMX

bool amx_attention_fits(uint32_t, int) { return false; }

void amx_attention_task(const AttnTask&) { throw MinferError("Attn: this build has no AMX attention"); }

#endif

}  // namespace minfer
