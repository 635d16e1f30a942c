// Whole-vocabulary scans the sampler runs once per token: the NaN check and
// greedy's argmax.  At 50-150 k logits the scalar loops cost 50-200 us a token
// (SmolLM2's whole decode step is ~6 ms), so each has an AVX2 version beside its
// scalar reference; both return the same index.
#pragma once

namespace minfer {

int first_nan(const float* x, int n);      // index of the first NaN, or -1
int first_argmax(const float* x, int n);   // index of the first maximum (x NaN-free, n > 0), as std::max_element

int first_nan_ref(const float* x, int n);
int first_argmax_ref(const float* x, int n);

}  // namespace minfer
