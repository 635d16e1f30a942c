// Matrix-vector products for decode and small batches, one simdgroup per
// output column, 4 columns per threadgroup: each lane dequantizes 8 weights
// at a time and dots them with the group's activation rows; the lanes' sums
// meet in simd_sum.  Two tiers share the body:
//   matvec_<type>       the single-token tier: one activation row per
//                       threadgroup row (grid.y = rows), one accumulator;
//   matmul_rows_<type>  the multi-token small tier: 8 activation rows per
//                       threadgroup row, each dequantized weight used 8 times.
// Both take the fused forms of MatvecArgs (q|k|v parts, biases, gate/up with
// SwiGLU), so a fused decode projection is one dispatch.  Columns past N are
// predicated off (no early return).
#include <metal_stdlib>
using namespace metal;
#include "args.h"
#include "quants.h"

// acc[r] = x[r, :K] . w[:K] for r < n (lane's share: units of 8 values lane, lane + 32, ...).
template <int T, int R>
static void dot_rows(device const uchar* w, device const float* x, uint x_ld, uint K, uint n, uint lane,
                     thread float* acc) {
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (uint c = lane; c < K / 8; c += 32) {
        float v[8];
        dequant8<T>(w, c * 8, v);
        for (uint r = 0; r < n; r++) {
            device const float* xr = x + r * x_ld + c * 8;
            float s = 0.0f;
            for (int i = 0; i < 8; i++) s += v[i] * xr[i];
            acc[r] += s;
        }
    }
}

template <int T, int R>
static void matvec_impl(constant MatvecArgs& a, device const uchar* w, device const float* x, device float* y,
                        device const float* bias, uint col, uint r0, uint lane) {
    const uint part = a.swiglu ? 0 : col < a.end0 ? 0 : col < a.end1 ? 1 : 2;
    const uint first = part == 0 ? 0 : part == 1 ? a.end0 : a.end1;
    const uint w_off = part == 0 ? a.w_off0 : part == 1 ? a.w_off1 : a.w_off2;
    const uint b_off = part == 0 ? a.b_off0 : part == 1 ? a.b_off1 : a.b_off2;
    const uint n = min(uint(R), a.n_rows - r0);
    device const float* xg = x + r0 * a.x_ld;
    float acc[R], up[R];
    for (int r = 0; r < R; r++) acc[r] = up[r] = 0.0f;
    if (col < a.N) {
        dot_rows<T, R>(w + w_off + (col - first) * a.row_bytes, xg, a.x_ld, a.K, n, lane, acc);
        if (a.swiglu) dot_rows<T, R>(w + a.w_off1 + col * a.row_bytes, xg, a.x_ld, a.K, n, lane, up);
    }
    for (int r = 0; r < R; r++) {  // every lane takes part in the collectives
        const float g = simd_sum(acc[r]);
        const float u = a.swiglu ? simd_sum(up[r]) : 0.0f;  // a.swiglu is uniform over the grid
        if (lane == 0 && col < a.N && uint(r) < n) {
            float out = g;
            if (a.has_bias) out += bias[b_off + col - first];
            if (a.swiglu) out = g / (1.0f + exp(-g)) * u;
            y[(r0 + r) * a.y_ld + col] = out;
        }
    }
}

kernel void matvec_f32(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_F32, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_f16(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_F16, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q4_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_0, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q4_1(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_1, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q5_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_0, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q5_1(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_1, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q8_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q8_0, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q4_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_K, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q5_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_K, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matvec_q6_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q6_K, 1>(a, w, x, y, bias, tg.x * 4 + sg, tg.y, lane);
}

kernel void matmul_rows_f32(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_F32, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_f16(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_F16, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q4_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_0, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q4_1(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_1, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q5_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_0, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q5_1(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_1, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q8_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q8_0, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q4_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_K, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q5_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_K, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}

kernel void matmul_rows_q6_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                           device const float* bias [[buffer(4)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q6_K, 8>(a, w, x, y, bias, tg.x * 4 + sg, tg.y * 8, lane);
}
