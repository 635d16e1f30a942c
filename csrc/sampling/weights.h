// A temperature softmax's unnormalized weights over a whole vocabulary, and their sums.
//
// A sampled token costs a softmax over every logit (152k for Qwen): the C library's exp in double took ~1.5 ms
// a row, longer than a batch step's share of the device.  Here e^x is our own f32 polynomial written as plain
// multiplies and adds (the build turns off FMA contraction), in loops the compiler vectorizes: every vector
// width and every platform computes the same bits, so a seed gives the same tokens everywhere.  Sums are in
// double, in a fixed order (eight interleaved partial sums a block of 1024), for the same reason.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace minfer {

// e^x for x <= 0 to about 2 ulp (x = n ln2 + r, e^r by the Cephes polynomial, 2^n through the exponent bits);
// 0 below -87.3 (and for -inf).
inline float exp_nonpositive(float x) {
    const bool gone = !(x >= -87.3f);
    x = gone ? -87.3f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23)
    float r = x - n * 0.693359375f;  // ln2 in two parts: n * the first is exact
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * (r * r) + (r + 1.0f);
    const int32_t bits = (int32_t(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return gone ? 0.0f : y * scale;
}

// w[i] = e^((x[i] - mx) inv_t) for i < n, every x[i] <= mx (-inf gives 0).
void softmax_weights(const float* x, int n, float mx, float inv_t, float* w);

// The tokens a block sum covers.
constexpr int kWeightBlock = 1024;

// sums[b] = the sum of w over block b; returns the sum of every weight (the block sums added in order).
double block_sums(const float* w, int n, std::vector<double>& sums);

// maxes[b] = the largest x of block b: a scan for the tokens above a threshold visits only the blocks that reach
// it (near the best logit, a few of a vocabulary's 150).
void block_maxes(const float* x, int n, std::vector<float>& maxes);

}  // namespace minfer
