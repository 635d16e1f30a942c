// The register-tiled attention (attention_tiles.inc) on NEON: 4 lanes, 8 queries x 8 keys of scores and
// 4 queries x 16 dims of sums a pass (16 accumulators of the 32 registers).
#include <arm_neon.h>

#include "backends/cpu/attention_tiles.inc"

namespace minfer {

namespace {

struct Neon {
    using V = float32x4_t;
    static constexpr int W = 4, kScoreRows = 8, kSumRows = 4, kSumVecs = 4;
    static V zero() { return vdupq_n_f32(0.0f); }
    static V load(const float* p) { return vld1q_f32(p); }
    static void store(float* p, V v) { vst1q_f32(p, v); }
    static void storeu(float* p, V v) { vst1q_f32(p, v); }
    static V set1(float x) { return vdupq_n_f32(x); }
    static V fmadd(V a, V b, V c) { return vfmaq_f32(c, a, b); }
    static V mul(V a, V b) { return vmulq_f32(a, b); }

    // 4 x 4 floats: out row i (at out + i * out_ld) = column i of the 4 rows at in + i * in_ld.
    static void transpose(const float* in, int in_ld, float* out, int out_ld) {
        const float32x4x2_t a = vtrnq_f32(vld1q_f32(in), vld1q_f32(in + in_ld));               // a0 b0 a2 b2 | a1 b1 a3 b3
        const float32x4x2_t b = vtrnq_f32(vld1q_f32(in + 2 * in_ld), vld1q_f32(in + 3 * in_ld));  // c0 d0 c2 d2 | ...
        vst1q_f32(out, vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0])));
        vst1q_f32(out + out_ld, vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1])));
        vst1q_f32(out + 2 * out_ld, vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0])));
        vst1q_f32(out + 3 * out_ld, vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1])));
    }
};

}  // namespace

void tiles_attention_task_neon(const AttnTask& t) { tiles::task<Neon>(t); }

}  // namespace minfer
