// The CUDA backend's class, shared by the files that implement it: cuda_backend.cu (device, weights, buffers,
// waits), cuda_execute.cu (a node's kernels), cuda_capture.cu (CUDA-graph capture and replay).  Reference:
// tests/test_cuda.py.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_api.h"
#include "backends/cuda/kernels.h"
#include "backends/kernel_choice.h"
#include "backends/offload.h"
#include "common/settings.h"
#include "quant/types.h"

namespace minfer::cuda_host {

using namespace cuda;

inline void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw MinferError(strfmt("CUDA: %s failed: %s", what, cudaGetErrorString(e)));
}

// A greedy chain waits after at most this many steps (bounded waits), and after as many as kChainResults
// winners hold (a fixed result buffer: 256 steps of 64 sequences).
constexpr int kChainSteps = 256, kChainResults = 1 << 14;

// How long a wait polls without sleeping (seconds): longer than any decode step of the models run here.
constexpr double kSpinS = 0.05;

// Polls event ev until it completes (cudaSuccess), fails (that CUDA error) or timeout_s pass (cudaErrorNotReady).
// Spin first: a decode step is 0.5-5 ms and a sleep wakes ~100 us late (a measurable share of a
// large model's step when the spin ended at 2 ms); long waits (prefill, a hung device) sleep between polls.
inline cudaError_t wait_event(cudaEvent_t ev, double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        const cudaError_t e = cudaEventQuery(ev);
        if (e != cudaErrorNotReady) return e;
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s > timeout_s) return cudaErrorNotReady;
        if (s > kSpinS) std::this_thread::sleep_for(std::chrono::microseconds(50));
        else std::this_thread::yield();
    }
}

inline std::string gib(size_t b) { return strfmt("%.2f GiB", double(b) / double(1ull << 30)); }

// Decode's activations are rounded to 8-bit blocks where the weight type has that kernel, as the CPU backend
// and llama.cpp do; the kernel choice cuda.decode_activations=f32 keeps them f32 (tests compare paths with it).
inline bool decode_q8() { return forced_kernel("cuda.decode_activations") != "f32"; }

// The QKV projection and the RoPE + KV store are one node, whose decode matvec rotates and stores in its
// epilogue where it can (elsewhere the node runs the projection, then the rope_kv_store kernel).  The kernel
// choice cuda.qkv_rope=0 keeps two nodes; =epilogue makes a one-row node whose matvec cannot take the epilogue
// an error (how tests show which path ran).
enum class QkvRope { Off, On, Epilogue };
inline QkvRope qkv_rope_mode() {
    const std::string v = forced_kernel("cuda.qkv_rope");
    return v == "0" ? QkvRope::Off : v == "epilogue" ? QkvRope::Epilogue : QkvRope::On;
}

struct DevWeight {
    const uint8_t* p = nullptr;
    uint32_t type = 0;
    int64_t rows = 0, cols = 0;
};

class CudaBackend : public Backend {
  public:
    CudaBackend(const WeightStore* weights, size_t reserve_bytes);
    ~CudaBackend() override;
    const char* name() const override { return "cuda"; }
    bool supports_op(const Node& node) const override;
    bool supports_fused(Op fused) const override {
        if (fused == Op::FusedQkvRope) return qkv_rope_mode() != QkvRope::Off;
        return fused == Op::SwiGLU || fused == Op::GeGLU || fused == Op::FusedQKV || fused == Op::FusedQkvNorm || fused == Op::FusedFFN ||
               fused == Op::RopeKvStore || fused == Op::AddRmsNorm;
    }
    bool has_weight(const std::string& name) const override { return weights_.count(name) != 0; }

    int alloc_buffer(size_t n_floats) override;
    void free_buffer(int id) override;
    int alloc_fresh(size_t n_floats) override;
    int alloc_kv(size_t bytes) override;
    size_t buffer_size(int id) const override { return bufs_.at(size_t(id)).bytes / 4; }

    void execute_node(const Node& node, const ExecArgs& args) override;
    void read_host(int id, size_t offset, float* dst, size_t n) override;
    float* host_buffer(size_t n_floats) override;
    void write_host(int id, size_t offset, const float* src, size_t n) override;
    void synchronize() override;
    int argmax(int id, size_t offset, size_t n, const uint32_t* allow = nullptr) override;
    void argmax_rows(int id, size_t offset, size_t n, int rows, size_t ld, int32_t* out,
                     const uint32_t* allow = nullptr) override;
    void top_k_rows(int id, size_t offset, size_t n, int rows, size_t ld, int k, float* vals, int32_t* ids) override;
    bool chains() const override { return true; }
    bool greedy_chain_rows(int steps, const std::function<void()>& step, int id, size_t offset, size_t n, int rows,
                           size_t ld, const ChainInputs& in, int32_t* out) override;

    bool replay_split(uint64_t key) override;
    bool begin_capture(uint64_t key) override;
    void end_capture(uint64_t key, bool ok) override;
    void forget_captures(uint64_t plan_id) override;

  private:
    struct Buf {
        void* p = nullptr;
        size_t bytes = 0;
        bool free = false;
    };
    const DevWeight& weight(const std::string& name) const;
    float* at(const BufRef& b) { return (float*)bufs_.at(size_t(b.id)).p + b.offset; }
    void* raw(int id) { return bufs_.at(size_t(id)).p; }
    void* device_alloc(size_t bytes, const char* what);
    template <class T> T* scratch(std::vector<T*>& slot, size_t& have, size_t need);
    struct Proj {
        const DevWeight* w;
        const float* bias;
        int64_t n_out, y_col;
    };
    // MatMul, FusedQKV (3 parts into column windows) and FusedFFN (gate, up; swiglu).
    // rope: FusedQkvRope's epilogue, taken by the decode matvec where it can (returns whether it did).
    bool project(const Node& node, const ExecArgs& a, const std::vector<Proj>& parts, bool swiglu,
                 const cuda::QkvRopeEpilogue* rope = nullptr);
    Proj proj(const std::string& w, const std::string& bias, int64_t n_out, int64_t y_col) const;
    // Constrained decoding's token masks, copied to the device behind the step (words of 32 tokens).
    const uint32_t* upload_allow(const uint32_t* allow, size_t words);
    void wait(cudaEvent_t ev, const char* what);
    void usable() const;
    [[noreturn]] void fail(const std::string& what);
    std::string recent() const;

    std::map<std::string, DevWeight> weights_;
    uint8_t* arena_ = nullptr;
    std::vector<Buf> bufs_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t done_ = nullptr;
    uint32_t* err_host_ = nullptr;  // host-mapped: kernels flag input errors here
    uint32_t* err_dev_ = nullptr;
    int* argmax_host_ = nullptr;    // host-mapped: the argmax kernel writes the token id here
    int* argmax_dev_ = nullptr;
    void* argmax_part_ = nullptr;   // the argmax's per-block winners
    int* split_counters_ = nullptr;  // gemm_mma's K ranges done a row range (zero between launches)
    int32_t* chain_host_ = nullptr;  // host-mapped: a greedy chain's tokens (kChainResults), read after its wait
    int32_t* chain_dev_ = nullptr;
    float* staging_ = nullptr;      // pinned, for bounded reads
    size_t staging_floats_ = 0;
    float* host_buf_ = nullptr;  // pinned, handed out by host_buffer(): read_host copies into it directly
    size_t host_buf_floats_ = 0;
    void* top_host_ = nullptr;  // host-mapped: top_k_rows's values, then its ids
    void* top_dev_ = nullptr;
    size_t top_bytes_ = 0;
    void* top_part_ = nullptr;  // top_k_rows's first-pass winners
    size_t top_part_bytes_ = 0;
    uint32_t* allow_host_ = nullptr;  // pinned: the masks of the argmax in flight (upload_allow)
    uint32_t* allow_dev_ = nullptr;
    size_t allow_words_ = 0;
    std::vector<__half*> wscratch_, xscratch_;  // one live pointer each (vector: freed lazily)
    std::vector<float*> ascratch_, fscratch_, kscratch_;  // attention partials; f32 staging; split-K partials
    std::vector<float*> qscratch_;  // decode's 8-bit activations, or a batch product's bf16 ones (mma_act's layout)
    size_t wscratch_n_ = 0, xscratch_n_ = 0, ascratch_n_ = 0, fscratch_n_ = 0, kscratch_n_ = 0, qscratch_n_ = 0;
    bool decode_q8_ = true;  // decode_q8() when the backend was made
    // The activations a node left in qscratch_ for the node right after it (the projection that reads them) to
    // skip converting them again: decode's 8-bit ones of an AddRmsNorm's norm window (prequant_), a batch
    // product's bf16 ones of a norm window or a SwiGLU's output (premma_); pending_*: the last node's.
    struct Prequant {
        const float* x = nullptr;  // the f32 activations ...
        int64_t ld = 0, K = 0;
        int rows = 0;
        const void* at = nullptr;  // ... converted into this scratch (a scratch that grew since lost them)
        bool of(const float* x_, int64_t ld_, int64_t K_, int rows_, const void* at_) const {
            return x && x == x_ && ld == ld_ && K == K_ && rows == rows_ && at == at_;
        }
    };
    Prequant prequant_, pending_, premma_, pending_mma_;
    // Anything but the next node (new inputs, a graph replayed or recorded, a wait) ends what a node prepared.
    void forget_prepared() { prequant_ = premma_ = Prequant{}; }
    // Whether a product of `rows` rows of weights gemm_mma takes runs on it (project()'s rule for a batch step).
    bool takes_mma(int rows) const;
    cuda::MmaAct mma_act_for(const std::string& w, int rows, int64_t K);
    std::map<uint64_t, cudaGraphExec_t> graphs_;
    std::set<uint64_t> seen_;
    bool graphs_on_ = true, capturing_ = false, failed_ = false;
    std::string failure_;
    double timeout_s_ = 10.0;
    std::set<Op> cpu_ops_;
    std::vector<std::string> recent_;  // ring of the last node names enqueued
    size_t recent_at_ = 0;
};

template <class T>
 T* CudaBackend::scratch(std::vector<T*>& slot, size_t& have, size_t need) {
    if (need <= have && !slot.empty()) return slot.back();
    if (capturing_) throw MinferError("CUDA: scratch would grow during a graph capture (a plan changed shape)");
    synchronize();
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
    seen_.clear();
    for (T* p : slot) cudaFree(p);
    slot.clear();
    slot.push_back((T*)device_alloc(need * sizeof(T), "GPU scratch"));
    have = need;
    return slot.back();
}

}  // namespace minfer::cuda_host
