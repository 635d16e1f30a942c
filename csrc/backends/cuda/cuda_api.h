// What the rest of minfer sees of the CUDA backend: whether a device is there,
// and a factory.  Plain C++ (no CUDA headers), so the session and the bindings
// compile the same with or without the CUDA toolkit; builds without it link
// cuda_stub.cpp, which reports why there is no device.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "runtime/weights.h"

namespace minfer {

struct CudaDeviceInfo {
    bool built = false;       // the extension was compiled with the CUDA backend
    bool available = false;   // ... and a usable device is present
    std::string reason;       // why not, when !available
    std::string name;         // e.g. "NVIDIA H200"
    int cc_major = 0, cc_minor = 0, sm_count = 0;
    size_t total_bytes = 0, free_bytes = 0;
};
CudaDeviceInfo cuda_device_info();

// Weights whose type the CUDA kernels cannot read (the all-weights-registered
// gate: the backend participates only when this is empty).
std::vector<std::string> cuda_unsupported_weights(const WeightStore& weights);

// Uploads every weight (pinned staging, one device arena) and returns the
// backend.  Throws OutOfMemoryError when weights + `reserve_bytes` do not fit.
std::unique_ptr<Backend> make_cuda_backend(const WeightStore* weights, size_t reserve_bytes);

// Kernel-level entry points for tests and benchmarks (their own allocations;
// synchronous).  y [rows, N] = x [rows, K] W^T through the path the backend
// takes for that many rows (matvec up to 8, else the tensor-core GEMM); with
// iters > 0 the call is then timed that many times with device events.
std::vector<float> cuda_matmul(uint32_t type, const uint8_t* w, size_t w_bytes, int64_t N, int64_t K, const float* x,
                               int rows, int iters, double* seconds_per_call, const std::string& path = "auto");
// The device-to-device copy rate (bytes read + bytes written per second) over `bytes`.
double cuda_copy_bandwidth(size_t bytes, int iters);
// The device argmax (greedy decoding's) of each of `rows` rows of x[rows, n] (one row: the decode step's kernels;
// more: a batch step's), among the indices `allow` ([rows, (n + 31) / 32] bit masks, or nullptr) lets win, run
// `reps` times back to back: each run's winners, and whether a run flagged a NaN among the values.
std::vector<int> cuda_argmax(const float* x, int n, int rows, int reps, const uint32_t* allow, bool* nan);
// The device top-k (a sampled batch step's) of `rows` rows of n floats: vals / ids [rows, k], and whether a NaN
// was flagged; with iters > 0 the call is then timed that many times.
void cuda_top_k(const float* x, int n, int rows, int k, float* vals, int32_t* ids, bool* nan, int iters = 0,
                double* seconds_per_call = nullptr);

// How many launches of each CUDA kernel (by name) this process has made (not counting graph replays).
std::map<std::string, long> cuda_launch_counts();

}  // namespace minfer
