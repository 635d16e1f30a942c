// Greedy decoding on the device: the index of the largest of n logits (the
// first on ties), so only 4 bytes come back.  One threadgroup; each thread
// scans a stride, then (value, index) pairs are reduced per simdgroup (the
// max value, then the smallest index holding it) and across simdgroups.  A NaN
// among the logits (never the winner: its comparisons are false) makes the
// result -1, which the host turns into an error.
#include <metal_stdlib>
using namespace metal;

kernel void argmax(constant uint& n [[buffer(0)]], device const float* x [[buffer(1)]], device int* out [[buffer(2)]],
                   threadgroup float* tv [[threadgroup(0)]], threadgroup uint* ti [[threadgroup(1)]],
                   uint tid [[thread_index_in_threadgroup]], uint ntg [[threads_per_threadgroup]],
                   uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                   uint nsg [[simdgroups_per_threadgroup]]) {
    float v = -INFINITY;
    uint i = n, nan = 0;
    for (uint j = tid; j < n; j += ntg) {
        const float xj = x[j];
        nan |= uint(xj != xj);
        if (xj > v) v = xj, i = j;  // strided scan: the first maximum of this thread's elements
    }
    const float best = simd_max(v);
    const uint first = simd_min(v == best ? i : n);
    const uint any_nan = simd_max(nan);
    if (lane == 0) tv[sg] = best, ti[sg] = any_nan ? n + 1 : first;  // n + 1: this simdgroup saw a NaN
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        float bv = tv[0];
        uint bi = ti[0];
        bool saw_nan = ti[0] == n + 1;
        for (uint s = 1; s < nsg; s++) {
            saw_nan = saw_nan || ti[s] == n + 1;
            if (tv[s] > bv || (tv[s] == bv && ti[s] < bi)) bv = tv[s], bi = ti[s];
        }
        out[0] = saw_nan ? -1 : bi < n ? int(bi) : 0;
    }
}
