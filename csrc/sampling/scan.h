// Whole-vocabulary scans the sampler runs once per token: the NaN check and
// greedy's argmax.  At 50-150 k logits the scalar loops cost 50-200 us a token
// (SmolLM2's whole decode step is ~6 ms), so each has an AVX2 version beside its
// scalar reference; both return the same index.
#pragma once
#include <cstdint>
#include <vector>

namespace minfer {

int first_nan(const float* x, int n);      // index of the first NaN, or -1
int first_argmax(const float* x, int n);   // index of the first maximum (x NaN-free, n > 0), as std::max_element

// Constrained decoding: the first maximum among the tokens whose bit is set in `allow` (bit t of allow[t / 32]),
// -1 if none is.  Words of 32 allowed tokens are scanned whole; others bit by bit.
int first_argmax_allowed(const float* x, int n, const uint32_t* allow);
// Whether any of tokens [0, n) is allowed.
bool any_allowed(const uint32_t* allow, int n);
// x[t] = -inf for every token t whose bit is clear; returns how many are allowed.
int mask_disallowed(float* x, int n, const uint32_t* allow);

// Token a before token b: the higher logit, then the lower id (top-k's order, and a cut's).
struct ByLogit {
    const float* x;
    bool operator()(int a, int b) const { return x[a] > x[b] || (x[a] == x[b] && a < b); }
};

// The k best tokens (by logit, then id) in that order, 0 < k < n: the best seen kept in a heap whose top is its
// worst, runs of 16 logits none above that worst passed over whole (a vocabulary costs about one compare a
// token, a sort of it ~1 ms at 152k).
void top_k(const float* x, int n, int k, std::vector<int>& out);

int first_nan_ref(const float* x, int n);
int first_argmax_ref(const float* x, int n);

}  // namespace minfer
