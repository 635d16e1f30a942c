// Writing one value or one q8_0 block of 32 into a KV cache row (the
// kv_store kernel and the fused rope_kv_store).  The source may be device or
// threadgroup memory, hence the template.
#pragma once

// d = amax / 127, q = round(x / d) (half away from zero), as the CPU's quantizer.
template <typename SRC>
static inline void store_q8_0(SRC x, device uchar* blk) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = max(amax, fabs(x[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    *(device half*)blk = half(d);
    for (int i = 0; i < 32; i++) ((device char*)(blk + 2))[i] = char(int(round(x[i] * id)));
}

// Value i of cache row p (f32 or f16; kv_type as in args.h).
static inline void store_value(device uchar* kv, uint kv_type, uint p, uint dim, uint i, float x) {
    if (kv_type == 1) ((device half*)kv)[p * dim + i] = half(x);
    else ((device float*)kv)[p * dim + i] = x;
}
