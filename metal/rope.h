// One rotated pair of one head (rope.metal and the fused rope_kv_store):
// dims i and i + rope_dim/2 (neox) or 2i and 2i+1, angle pos * freq[i] rounded
// once in float (Metal has no double; the host computes freq in double), or,
// for i past rope_dim/2, the pair of unrotated dims it stands for copied.
#pragma once

template <typename OUT>
static inline void rope_pair(device const float* xh, OUT yh, uint i, uint rope_dim, uint neox, int pos,
                             device const float* freq) {
    const uint half_dim = rope_dim / 2;
    if (i >= half_dim) {
        const uint j = rope_dim + 2 * (i - half_dim);
        yh[j] = xh[j];
        yh[j + 1] = xh[j + 1];
    } else {
        const float theta = float(pos) * freq[i];
        const float s = precise::sin(theta), c = precise::cos(theta);
        const uint i0 = neox ? i : 2 * i, i1 = neox ? i + half_dim : 2 * i + 1;
        const float x0 = xh[i0], x1 = xh[i1];
        yh[i0] = x0 * c - x1 * s;
        yh[i1] = x0 * s + x1 * c;
    }
}
