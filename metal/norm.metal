// RMSNorm over groups of `width` columns (the whole row for RmsNorm, one head
// for QkNorm): one threadgroup per (row, group); the sum of squares is reduced
// over each simdgroup, then the simdgroups' sums in a fixed order, so every
// thread computes the same scale.
#include <metal_stdlib>
using namespace metal;
#include "args.h"

kernel void rms_norm(constant NormArgs& a          [[buffer(0)]],
                     device const float* x         [[buffer(1)]],
                     device const float* w         [[buffer(2)]],
                     device float* y               [[buffer(3)]],
                     threadgroup float* partial    [[threadgroup(0)]],
                     uint2 tg                      [[threadgroup_position_in_grid]],
                     uint tid                      [[thread_index_in_threadgroup]],
                     uint ntg                      [[threads_per_threadgroup]],
                     uint lane                     [[thread_index_in_simdgroup]],
                     uint sg                       [[simdgroup_index_in_threadgroup]],
                     uint nsg                      [[simdgroups_per_threadgroup]]) {
    device const float* xr = x + tg.x * a.x_ld + tg.y * a.width;
    device float* yr = y + tg.x * a.y_ld + tg.y * a.width;
    float ss = 0.0f;
    for (uint i = tid; i < a.width; i += ntg) ss += xr[i] * xr[i];
    ss = simd_sum(ss);
    if (lane == 0) partial[sg] = ss;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint s = 0; s < nsg; s++) total += partial[s];
    const float scale = rsqrt(total / float(a.width) + a.eps);
    for (uint i = tid; i < a.width; i += ntg) yr[i] = xr[i] * scale * w[i];
}

// The residual add fused with the next RMSNorm, one threadgroup per row: the
// sum a + b to y[:, :width], its normalization to y[:, width:]; each thread
// re-reads only the sums it wrote.  The same reduction order as rms_norm.
kernel void add_rms_norm(constant AddNormArgs& a   [[buffer(0)]],
                         device const float* x     [[buffer(1)]],
                         device const float* b     [[buffer(2)]],
                         device const float* w     [[buffer(3)]],
                         device float* y           [[buffer(4)]],
                         threadgroup float* partial [[threadgroup(0)]],
                         uint row                  [[threadgroup_position_in_grid]],
                         uint tid                  [[thread_index_in_threadgroup]],
                         uint ntg                  [[threads_per_threadgroup]],
                         uint lane                 [[thread_index_in_simdgroup]],
                         uint sg                   [[simdgroup_index_in_threadgroup]],
                         uint nsg                  [[simdgroups_per_threadgroup]]) {
    device const float* xr = x + row * a.a_ld;
    device const float* br = b + row * a.b_ld;
    device float* sr = y + row * a.y_ld;
    float ss = 0.0f;
    for (uint i = tid; i < a.width; i += ntg) {
        const float v = xr[i] + br[i];
        sr[i] = v;
        ss += v * v;
    }
    ss = simd_sum(ss);
    if (lane == 0) partial[sg] = ss;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint s = 0; s < nsg; s++) total += partial[s];
    const float scale = rsqrt(total / float(a.width) + a.eps);
    for (uint i = tid; i < a.width; i += ntg) sr[a.width + i] = sr[i] * scale * w[i];
}
