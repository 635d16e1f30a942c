// Elementwise ops over row windows: add, mul, silu, silu(a) * b, copy (TailRow), gelu (tanh form, as
// x / (1 + e^(-2z)) like the CPU's), gelu(a) * b, scale, softcap (s tanh(x / s)).  One thread
// per element; grid (column blocks, rows).  In place is safe (each thread
// reads its element before writing it).
#include <metal_stdlib>
using namespace metal;
#include "args.h"

kernel void elementwise(constant EwArgs& a   [[buffer(0)]],
                        device const float* x [[buffer(1)]],
                        device const float* b [[buffer(2)]],
                        device float* y       [[buffer(3)]],
                        uint2 gid             [[thread_position_in_grid]]) {
    const uint c = gid.x, r = gid.y;
    if (c < a.cols) {
        const float v = x[r * a.a_ld + c];
        float out;
        if (a.op == EW_ADD) out = v + b[r * a.b_ld + c];
        else if (a.op == EW_MUL) out = v * b[r * a.b_ld + c];
        else if (a.op == EW_SILU) out = v / (1.0f + exp(-v));
        else if (a.op == EW_COPY) out = v;
        else if (a.op == EW_GELU || a.op == EW_GEGLU) {
            out = v / (1.0f + exp(-1.5957691216f * v * (1.0f + 0.044715f * v * v)));
            if (a.op == EW_GEGLU) out *= b[r * a.b_ld + c];
        } else if (a.op == EW_SCALE) out = v * a.scale;
        else if (a.op == EW_SOFTCAP) out = a.scale * tanh(v / a.scale);
        else out = v / (1.0f + exp(-v)) * b[r * a.b_ld + c];
        y[r * a.y_ld + c] = out;
    }
}
