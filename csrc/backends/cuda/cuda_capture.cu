// The CUDA backend's graph capture: a split is recorded as a CUDA graph on its second run and replayed after
// that, so a decode step is one graph launch.  Reference: tests/test_cuda.py (graph replay tests).
#include "backends/cuda/cuda_backend.cuh"

namespace minfer::cuda_host {

// ---- graph capture ------------------------------------------------------------

bool CudaBackend::replay_split(uint64_t key) {
    usable();
    forget_prepared();
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    recent_[recent_at_] = strfmt("graph replay of split %llu", (unsigned long long)(key & 0xfffff));
    recent_at_ = (recent_at_ + 1) % recent_.size();
    check(cudaGraphLaunch(it->second, stream_), "launching a recorded graph");
    return true;
}

bool CudaBackend::begin_capture(uint64_t key) {
    usable();
    forget_prepared();
    if (!graphs_on_) return false;
    if (seen_.insert(key).second) return false;  // first run: plain launches (scratch sizes settle)
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "beginning a graph capture");
    capturing_ = true;
    return true;
}

void CudaBackend::end_capture(uint64_t key, bool ok) {
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &g);
    if (!ok) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return;
    }
    check(e, "ending a graph capture");
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    check(e, "instantiating a graph");
    graphs_[key] = exec;
    check(cudaGraphLaunch(exec, stream_), "launching a recorded graph");
}

void CudaBackend::forget_captures(uint64_t plan_id) {
    for (auto it = graphs_.begin(); it != graphs_.end();) {
        if (it->first >> 20 == plan_id) {
            cudaGraphExecDestroy(it->second);
            it = graphs_.erase(it);
        } else {
            ++it;
        }
    }
    for (auto it = seen_.begin(); it != seen_.end();) it = (*it >> 20 == plan_id) ? seen_.erase(it) : std::next(it);
}

}  // namespace minfer::cuda_host
