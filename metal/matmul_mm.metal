// The simdgroup-matrix tier of the matmul (prefill, more than 4 activation
// rows): a threadgroup of 4 simdgroups computes a 32 (rows of x) x 64 (output
// columns) tile, walking K in steps of 32: the weight tile is dequantized into
// threadgroup memory (one dequant8 per thread per 8 values), x's tile copied
// beside it, and each simdgroup multiplies 8 x 8 blocks into a 16 x 32 corner
// of the tile.  f32 throughout, so it rounds like the single-token tier.
#include <metal_stdlib>
using namespace metal;
#include "args.h"
#include "quants.h"

template <int T>
static void matmul_mm_impl(constant MatmulArgs& a, device const uchar* w, device const float* x, device float* y,
                           threadgroup float* ws, threadgroup float* xs, threadgroup float* cs, uint2 tg, uint tid,
                           uint sg) {
    const uint n0 = tg.x * 64, m0 = tg.y * 32;
    simdgroup_float8x8 acc[2][4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k0 = 0; k0 < a.K; k0 += 32) {
        for (uint e = tid; e < 64 * 4; e += 128) {  // 64 weight rows x 4 chunks of 8
            const uint n = e / 4, c = e % 4;
            float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (n0 + n < a.N) dequant8<T>(w + (n0 + n) * a.row_bytes, k0 + c * 8, v);
            for (int i = 0; i < 8; i++) ws[n * 32 + c * 8 + i] = v[i];
        }
        for (uint e = tid; e < 32 * 32; e += 128) {
            const uint m = e / 32, c = e % 32;
            xs[e] = m0 + m < a.M ? x[(m0 + m) * a.x_ld + k0 + c] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        const uint r0 = (sg / 2) * 16, c0 = (sg % 2) * 32;  // this simdgroup's corner of the 32 x 64 tile
        for (uint k = 0; k < 32; k += 8) {
            simdgroup_float8x8 fa[2], fb[4];
            for (int i = 0; i < 2; i++) simdgroup_load(fa[i], xs, 32, ulong2(k, r0 + 8 * i));
            for (int j = 0; j < 4; j++) simdgroup_load(fb[j], ws, 32, ulong2(k, c0 + 8 * j), true);  // W^T
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 4; j++) simdgroup_multiply_accumulate(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the tiles are reloaded next
    }
    const uint r0 = (sg / 2) * 16, c0 = (sg % 2) * 32;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) simdgroup_store(acc[i][j], cs, 64, ulong2(c0 + 8 * j, r0 + 8 * i));
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < 32 * 64; e += 128) {
        const uint m = e / 64, n = e % 64;
        if (m0 + m < a.M && n0 + n < a.N) y[(m0 + m) * a.y_ld + n0 + n] = cs[e];
    }
}

kernel void matmul_mm_f32(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_F32>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_f16(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_F16>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q4_0(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q4_0>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q4_1(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q4_1>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q5_0(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q5_0>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q5_1(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q5_1>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q8_0(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q8_0>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q4_K(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q4_K>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q5_K(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q5_K>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}

kernel void matmul_mm_q6_K(constant MatmulArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                         device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                         threadgroup float* ws [[threadgroup(0)]], threadgroup float* xs [[threadgroup(1)]],
                         threadgroup float* cs [[threadgroup(2)]], uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    matmul_mm_impl<T_Q6_K>(a, w, x, y, ws, xs, cs, tg, tid, sg);
}
