// Single-token-tier matrix-vector products (decode): one simdgroup per
// output row, 4 rows per threadgroup; each lane dequantizes 8 weights at a
// time and dots them with up to 4 activation rows; the lanes' sums meet in
// simd_sum.  Rows past N are predicated off (no early return).
#include <metal_stdlib>
using namespace metal;
#include "args.h"
#include "quants.h"

template <int T>
static void matvec_impl(constant MatvecArgs& a, device const uchar* w, device const float* x, device float* y,
                        uint row, uint lane) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (row < a.N) {
        device const uchar* wr = w + row * a.row_bytes;
        for (uint c = lane; c < a.K / 8; c += 32) {
            float v[8];
            dequant8<T>(wr, c * 8, v);
            for (uint r = 0; r < a.n_rows; r++) {
                device const float* xr = x + r * a.x_ld + c * 8;
                float s = 0.0f;
                for (int i = 0; i < 8; i++) s += v[i] * xr[i];
                acc[r] += s;
            }
        }
    }
    for (uint r = 0; r < 4; r++) {  // every lane takes part in the collective
        const float total = simd_sum(acc[r]);
        if (lane == 0 && row < a.N && r < a.n_rows) y[r * a.y_ld + row] = total;
    }
}

kernel void matvec_f32(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_F32>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_f16(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_F16>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q4_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_0>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q4_1(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_1>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q5_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_0>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q5_1(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_1>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q8_0(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q8_0>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q4_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q4_K>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q5_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q5_K>(a, w, x, y, tg * 4 + sg, lane);
}

kernel void matvec_q6_K(constant MatvecArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                      device const float* x [[buffer(2)]], device float* y [[buffer(3)]],
                      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    matvec_impl<T_Q6_K>(a, w, x, y, tg * 4 + sg, lane);
}
