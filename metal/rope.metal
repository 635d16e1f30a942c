// Rotary embedding at each row's position: one thread per rotated pair
// (neox: dims i and i + rope_dim/2; otherwise 2i and 2i+1), dims past
// rope_dim copied.  Metal has no double: the host passes the frequencies
// base^(-2i/rope_dim) computed in double, so the angle pos * freq is rounded
// once (its error is ulp(angle) / 2, ~2e-4 rad at position 4096).
#include <metal_stdlib>
using namespace metal;
#include "args.h"
#include "rope.h"

kernel void rope(constant RopeArgs& a     [[buffer(0)]],
                 device const float* x    [[buffer(1)]],
                 device const int* pos    [[buffer(2)]],
                 device const float* freq [[buffer(3)]],
                 device float* y          [[buffer(4)]],
                 uint2 gid                [[thread_position_in_grid]]) {
    const uint t = gid.x, r = gid.y, pairs = a.head_dim / 2;
    if (t < a.cols / 2) {
        const uint h = t / pairs;
        rope_pair(x + r * a.x_ld + h * a.head_dim, y + r * a.y_ld + h * a.head_dim, t % pairs, a.rope_dim, a.neox,
                  pos[r], freq);
    }
}
