// Embedding gather: y[r, :] = dequant(W[ids[r], :]); one thread per 8 values,
// grid (value groups, rows).  An id out of range writes zeros and sets the
// error word (the host raises it after the command buffer completes).
#include <metal_stdlib>
using namespace metal;
#include "args.h"
#include "quants.h"

template <int T>
static void get_rows_impl(constant GetRowsArgs& a, device const uchar* w, device const int* ids, device float* y,
                          device atomic_uint* err, uint c, uint r) {
    if (c < a.K / 8) {
        const int id = ids[r];
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (id >= 0 && uint(id) < a.n_rows_w) dequant8<T>(w + uint(id) * a.row_bytes, c * 8, v);
        else if (c == 0) atomic_fetch_or_explicit(err, 1u, memory_order_relaxed);
        for (int i = 0; i < 8; i++) y[r * a.y_ld + c * 8 + i] = v[i];
    }
}

kernel void get_rows_f32(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_F32>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_f16(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_F16>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q4_0(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q4_0>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q4_1(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q4_1>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q5_0(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q5_0>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q5_1(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q5_1>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q8_0(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q8_0>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q4_K(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q4_K>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q5_K(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q5_K>(a, w, ids, y, err, gid.x, gid.y);
}

kernel void get_rows_q6_K(constant GetRowsArgs& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const int* ids [[buffer(2)]], device float* y [[buffer(3)]],
                        device atomic_uint* err [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
    get_rows_impl<T_Q6_K>(a, w, ids, y, err, gid.x, gid.y);
}
