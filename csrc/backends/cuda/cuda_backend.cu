// The CUDA backend: the Backend contract over one device and one stream.
//
// * Weights are uploaded once, at construction, into one device arena through
//   pinned staging (two buffers, so the copy of one chunk overlaps the memcpy
//   of the next), and registered by name.
// * Buffers and KV regions are plain cudaMalloc allocations (never managed).
// * execute_node only enqueues; synchronize waits with a bound
//   (MINFER_GPU_TIMEOUT_S, default 10 s), and a timeout or a CUDA error is an
//   exception naming the last kernels enqueued, after which the backend refuses
//   work.  Input errors found on the device (token id, position) are flagged in
//   host-mapped memory and raised at the next synchronize.
// * Splits are captured as CUDA graphs on their second run and replayed after
//   that (MINFER_CUDA_GRAPHS=0 turns this off): the decode step becomes one
//   graph launch per token.  Scratch that would grow frees every recording.
// * MINFER_CPU_OPS=Rope,Add,... leaves those ops to the CPU (mixed graphs).
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

namespace minfer {

namespace {

using namespace cuda;

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw MinferError(strfmt("CUDA: %s failed: %s", what, cudaGetErrorString(e)));
}

// A greedy chain waits after at most this many steps (bounded waits, a fixed result buffer).
constexpr int kChainSteps = 256;

// How long a wait polls without sleeping (seconds): longer than any decode step of the models run here.
constexpr double kSpinS = 0.05;

// Polls event ev until it completes (cudaSuccess), fails (that CUDA error) or timeout_s pass (cudaErrorNotReady).
// Spin first: a decode step is 0.5-5 ms and a sleep wakes ~100 us late (that was 6 % of the 7B's step when the
// spin ended at 2 ms); long waits (prefill, a hung device) sleep between polls.
cudaError_t wait_event(cudaEvent_t ev, double timeout_s) {
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

std::string gib(size_t b) { return strfmt("%.2f GiB", double(b) / double(1ull << 30)); }

// Decode's activations are rounded to 8-bit blocks where the weight type has that kernel, as the CPU backend
// and llama.cpp do; the kernel choice cuda.decode_activations=f32 keeps them f32 (tests compare paths with it).
bool decode_q8() { return forced_kernel("cuda.decode_activations") != "f32"; }

// The QKV projection and the RoPE + KV store are one node, whose decode matvec rotates and stores in its
// epilogue where it can (elsewhere the node runs the projection, then the rope_kv_store kernel).  The kernel
// choice cuda.qkv_rope=0 keeps two nodes; =epilogue makes a one-row node whose matvec cannot take the epilogue
// an error (how tests show which path ran).
enum class QkvRope { Off, On, Epilogue };
QkvRope qkv_rope_mode() {
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
        return fused == Op::SwiGLU || fused == Op::FusedQKV || fused == Op::FusedQkvNorm || fused == Op::FusedFFN ||
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
    void write_host(int id, size_t offset, const float* src, size_t n) override;
    void synchronize() override;
    int argmax(int id, size_t offset, size_t n) override;
    bool greedy_chain(int steps, const std::function<void()>& step, int id, size_t offset, size_t n, int token_id,
                      int pos_id, int32_t* out) override;

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
    int32_t* chain_host_ = nullptr;  // host-mapped: a greedy chain's tokens (kChainSteps), read after its wait
    int32_t* chain_dev_ = nullptr;
    float* staging_ = nullptr;      // pinned, for bounded reads
    size_t staging_floats_ = 0;
    std::vector<__half*> wscratch_, xscratch_;  // one live pointer each (vector: freed lazily)
    std::vector<float*> ascratch_, fscratch_, kscratch_;  // attention partials; f32 staging; split-K partials
    std::vector<float*> qscratch_;                        // decode's 8-bit activations
    size_t wscratch_n_ = 0, xscratch_n_ = 0, ascratch_n_ = 0, fscratch_n_ = 0, kscratch_n_ = 0, qscratch_n_ = 0;
    bool decode_q8_ = true;  // decode_q8() when the backend was made
    // The 8-bit activations an AddRmsNorm left in qscratch_ (its norm window), for the node right after it
    // (the projection that reads the norm) to skip quantizing them again.
    struct Prequant {
        const float* x = nullptr;
        int64_t ld = 0, K = 0;
        int rows = 0;
    };
    Prequant prequant_, pending_;
    std::map<uint64_t, cudaGraphExec_t> graphs_;
    std::set<uint64_t> seen_;
    bool graphs_on_ = true, capturing_ = false, failed_ = false;
    std::string failure_;
    double timeout_s_ = 10.0;
    std::set<Op> cpu_ops_;
    std::vector<std::string> recent_;  // ring of the last node names enqueued
    size_t recent_at_ = 0;
};

CudaBackend::CudaBackend(const WeightStore* weights, size_t reserve_bytes) {
    timeout_s_ = gpu_timeout_s();
    graphs_on_ = setting_bool("MINFER_CUDA_GRAPHS");
    cpu_ops_ = cpu_ops_setting();
    decode_q8_ = decode_q8();
    recent_.resize(8);
    check(cudaSetDevice(0), "selecting device 0");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "creating an event");
    check(cudaHostAlloc((void**)&err_host_, sizeof(uint32_t), cudaHostAllocMapped), "allocating the error word");
    *err_host_ = 0;
    check(cudaHostGetDevicePointer((void**)&err_dev_, err_host_, 0), "mapping the error word");
    check(cudaHostAlloc((void**)&argmax_host_, sizeof(int), cudaHostAllocMapped), "allocating the argmax word");
    check(cudaHostGetDevicePointer((void**)&argmax_dev_, argmax_host_, 0), "mapping the argmax word");
    argmax_part_ = device_alloc(size_t(cuda::kArgmaxBlocks) * 8, "the argmax scratch");
    check(cudaHostAlloc((void**)&chain_host_, kChainSteps * sizeof(int32_t), cudaHostAllocMapped),
          "allocating the chain's results");
    check(cudaHostGetDevicePointer((void**)&chain_dev_, chain_host_, 0), "mapping the chain's results");

    // Weights: one arena, each tensor 256-byte aligned, its rows as the device lays them (cuda::lay_rows: Q6_K's
    // padded and re-laid, q6k_layout.cuh; every other type as in the file).
    auto dev_bytes = [](const Weight& w) {
        return type_supported(w.type) ? size_t(w.rows()) * size_t(cuda::row_bytes(w.type, w.cols())) : w.nbytes;
    };
    size_t total = 0;
    for (auto& [name, w] : weights->all()) total += (dev_bytes(w) + 255) / 256 * 256;
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "querying device memory");
    if (total + reserve_bytes > free_b)
        throw OutOfMemoryError(strfmt("the model's weights (%s) and KV cache (%s) do not fit in the GPU's free memory "
                                      "(%s of %s); use a smaller n_ctx or device='cpu'",
                                      gib(total).c_str(), gib(reserve_bytes).c_str(), gib(free_b).c_str(),
                                      gib(total_b).c_str()));
    total += 256;  // slack: decode kernels may read a few bytes past a tensor's last block (aligned word loads)
    arena_ = (uint8_t*)device_alloc(total, "the weight arena");
    constexpr size_t kChunk = 64ull << 20;
    uint8_t* pinned[2] = {nullptr, nullptr};
    cudaEvent_t copied[2];
    for (int i = 0; i < 2; i++) {
        check(cudaHostAlloc((void**)&pinned[i], kChunk, cudaHostAllocDefault), "allocating pinned staging");
        check(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming), "creating an event");
        check(cudaEventRecord(copied[i], stream_), "recording an event");
    }
    size_t off = 0;
    int which = 0;
    try {
        for (auto& [name, w] : weights->all()) {
            if (!type_supported(w.type)) continue;  // not registered: the gate keeps the backend out
            if (w.nbytes == 0 || w.cols() == 0) {
                weights_[name] = DevWeight{arena_ + off, w.type, w.rows(), w.cols()};
                continue;
            }
            // whole rows a staging buffer (a row of the largest tensor is well under kChunk)
            const int64_t rows = w.rows(), src_rb = int64_t(w.nbytes) / rows, dst_rb = cuda::row_bytes(w.type, w.cols());
            const int64_t per_chunk = std::max<int64_t>(1, int64_t(kChunk) / dst_rb);
            if (dst_rb > int64_t(kChunk) || src_rb * rows != int64_t(w.nbytes))
                throw MinferError(strfmt("CUDA: weight '%s' has rows of %lld bytes (staging takes whole rows of at "
                                         "most %zu)", name.c_str(), (long long)dst_rb, kChunk));
            for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
                const int64_t nr = std::min(per_chunk, rows - r0);
                wait(copied[which], "uploading weights");  // this staging buffer's last copy is done
                cuda::lay_rows(w.type, w.data + r0 * src_rb, pinned[which], nr, w.cols());
                check(cudaMemcpyAsync(arena_ + off + r0 * dst_rb, pinned[which], size_t(nr * dst_rb),
                                      cudaMemcpyHostToDevice, stream_), "uploading a weight");
                check(cudaEventRecord(copied[which], stream_), "recording an event");
                which ^= 1;
            }
            weights_[name] = DevWeight{arena_ + off, w.type, w.rows(), w.cols()};
            off += (dev_bytes(w) + 255) / 256 * 256;
        }
        synchronize();
    } catch (...) {
        for (int i = 0; i < 2; i++) cudaFreeHost(pinned[i]), cudaEventDestroy(copied[i]);
        throw;
    }
    for (int i = 0; i < 2; i++) cudaFreeHost(pinned[i]), cudaEventDestroy(copied[i]);
}

CudaBackend::~CudaBackend() {
    // Nothing of ours may still run on memory freed below; the wait is bounded
    // like every other (a hung device leaks its memory rather than hang exit).
    const auto t0 = std::chrono::steady_clock::now();
    while (cudaStreamQuery(stream_) == cudaErrorNotReady &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s_)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (cudaStreamQuery(stream_) == cudaErrorNotReady) return;
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
    for (Buf& b : bufs_) cudaFree(b.p);
    for (auto* p : wscratch_) cudaFree(p);
    for (auto* p : xscratch_) cudaFree(p);
    for (auto* p : ascratch_) cudaFree(p);
    for (auto* p : fscratch_) cudaFree(p);
    for (auto* p : kscratch_) cudaFree(p);
    for (auto* p : qscratch_) cudaFree(p);
    cudaFree(arena_);
    cudaFreeHost(err_host_);
    cudaFreeHost(argmax_host_);
    cudaFreeHost(chain_host_);
    cudaFree(argmax_part_);
    cudaFreeHost(staging_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
}

void* CudaBackend::device_alloc(size_t bytes, const char* what) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        throw OutOfMemoryError(strfmt("CUDA: %s (%s) does not fit in the GPU's free memory (%s of %s)", what,
                                      gib(bytes).c_str(), gib(f).c_str(), gib(t).c_str()));
    }
    check(e, what);
    return p;
}

const DevWeight& CudaBackend::weight(const std::string& name) const {
    auto it = weights_.find(name);
    if (it == weights_.end()) throw MinferError(strfmt("CUDA: weight '%s' is not registered on the device", name.c_str()));
    return it->second;
}

bool CudaBackend::supports_op(const Node& node) const {
    if (cpu_ops_.count(node.op)) return false;
    auto f32_weight = [&](const std::string& w) {
        auto it = weights_.find(w);
        return it != weights_.end() && it->second.type == GGML_TYPE_F32;
    };
    const bool kv_ok = (node.meta.kv_type == GGML_TYPE_F16 || node.meta.kv_type == GGML_TYPE_F32 ||
                        node.meta.kv_type == GGML_TYPE_Q8_0) && node.meta.head_dim <= 256;  // the cache's kernels
    switch (node.op) {
        case Op::Input: case Op::TailRow: case Op::Rope: case Op::Add: case Op::Mul: case Op::Silu: case Op::SwiGLU:
            return true;
        case Op::RmsNorm: case Op::QkNorm: case Op::AddRmsNorm:
            return f32_weight(node.meta.weight);
        case Op::MatMul:  // the kernels take K in whole 32-value units
            return has_weight(node.meta.weight) && weights_.at(node.meta.weight).cols % 32 == 0 &&
                   (node.meta.bias.empty() || f32_weight(node.meta.bias));
        case Op::GetRows:
            return has_weight(node.meta.weight);
        case Op::FusedQKV:
            return has_weight(node.meta.wq) && has_weight(node.meta.wk) && has_weight(node.meta.wv);
        case Op::FusedQkvNorm:
            return has_weight(node.meta.wq) && has_weight(node.meta.wk) && has_weight(node.meta.wv) &&
                   f32_weight(node.meta.q_norm) && f32_weight(node.meta.k_norm);
        case Op::FusedFFN:
            return has_weight(node.meta.w_gate) && has_weight(node.meta.w_up);
        case Op::KvStore: case Op::Attn: case Op::RopeKvStore:
            return kv_ok;
        case Op::FusedQkvRope:
            return has_weight(node.meta.wq) && has_weight(node.meta.wk) && has_weight(node.meta.wv) && kv_ok;
        default:
            return false;
    }
}

// ---- buffers -------------------------------------------------------------------

int CudaBackend::alloc_buffer(size_t n) {
    for (size_t i = 0; i < bufs_.size(); i++)
        if (bufs_[i].free && bufs_[i].bytes == n * 4) {
            bufs_[i].free = false;
            return int(i);
        }
    return alloc_fresh(n);
}

void CudaBackend::free_buffer(int id) { bufs_.at(size_t(id)).free = true; }

int CudaBackend::alloc_fresh(size_t n) {
    bufs_.push_back({device_alloc(std::max<size_t>(n, 1) * 4, "an activation buffer"), n * 4, false});
    return int(bufs_.size()) - 1;
}

int CudaBackend::alloc_kv(size_t bytes) {
    const size_t padded = (bytes + 3) / 4 * 4;
    void* p = device_alloc(std::max<size_t>(padded, 4), "a KV cache region");
    check(cudaMemsetAsync(p, 0, padded, stream_), "clearing the KV cache");
    bufs_.push_back({p, padded, false});
    return int(bufs_.size()) - 1;
}

// A scratch area that only grows.  Growing frees the old one after a full
// wait, and with it every recorded graph (they point at the old area).
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

// ---- execution -------------------------------------------------------------------

void CudaBackend::usable() const {
    if (failed_) throw MinferError("CUDA backend is unusable after an earlier failure: " + failure_);
}

std::string CudaBackend::recent() const {
    std::string out;
    for (size_t i = 0; i < recent_.size(); i++) {
        const std::string& n = recent_[(recent_at_ + i) % recent_.size()];
        if (!n.empty()) out += (out.empty() ? "" : ", ") + n;
    }
    return out.empty() ? "(none)" : out;
}

void CudaBackend::fail(const std::string& what) {
    failed_ = true;
    failure_ = what + "; last kernels enqueued: " + recent();
    throw MinferError("CUDA: " + failure_);
}

void CudaBackend::wait(cudaEvent_t ev, const char* what) {
    const cudaError_t e = wait_event(ev, timeout_s_);
    if (e == cudaErrorNotReady)
        fail(strfmt("%s: the GPU did not finish within %.1f s (MINFER_GPU_TIMEOUT_S)", what, timeout_s_));
    if (e != cudaSuccess) fail(strfmt("%s: %s", what, cudaGetErrorString(e)));
}

void CudaBackend::synchronize() {
    usable();
    check(cudaEventRecord(done_, stream_), "recording an event");
    wait(done_, "synchronize");
    const uint32_t e = *(volatile uint32_t*)err_host_;
    if (e) {
        *err_host_ = 0;
        if (e == kNanLogit) throw MinferError("CUDA: a logit is NaN (the model produced NaN)");
        throw MinferError(strfmt("CUDA: invalid input found on the device:%s%s%s",
                                 e & kBadTokenId ? " a token id is out of range of the embedding" : "",
                                 e & kBadPosition ? " a position is outside the KV cache" : "",
                                 e & kNanLogit ? " (and a logit is NaN)" : ""));
    }
}

void CudaBackend::read_host(int id, size_t offset, float* dst, size_t n) {
    usable();
    if (n > staging_floats_) {
        if (staging_) cudaFreeHost(staging_);
        staging_ = nullptr;
        staging_floats_ = 0;
        check(cudaHostAlloc((void**)&staging_, n * 4, cudaHostAllocDefault), "allocating pinned staging");
        staging_floats_ = n;
    }
    check(cudaMemcpyAsync(staging_, (float*)raw(id) + offset, n * 4, cudaMemcpyDeviceToHost, stream_), "reading a buffer");
    synchronize();
    std::memcpy(dst, staging_, n * 4);
}

int CudaBackend::argmax(int id, size_t offset, size_t n) {
    usable();
    cuda::argmax((const float*)raw(id) + offset, int(n), argmax_dev_, argmax_part_, err_dev_, stream_);
    synchronize();
    return *(volatile int*)argmax_host_;
}

// The steps follow each other with no host write between them: the step's first kernel (the embedding
// gather) waits for the argmax before it lets the rest of the step start (pdl_wait_then_release), so the
// kernels that read the token and position before their own waits see this step's.
bool CudaBackend::greedy_chain(int steps, const std::function<void()>& step, int id, size_t offset, size_t n,
                               int token_id, int pos_id, int32_t* out) {
    usable();
    for (int done = 0; done < steps;) {
        const int m = std::min(kChainSteps, steps - done);
        for (int i = 0; i < m; i++) {
            step();
            cuda::argmax((const float*)raw(id) + offset, int(n), argmax_dev_, argmax_part_, err_dev_, stream_,
                         cuda::ArgmaxFeed{(int32_t*)raw(token_id), (int32_t*)raw(pos_id), chain_dev_ + i});
        }
        synchronize();
        std::memcpy(out + done, (const void*)chain_host_, size_t(m) * sizeof(int32_t));
        done += m;
    }
    return true;
}

void CudaBackend::write_host(int id, size_t offset, const float* src, size_t n) {
    usable();
    // Pageable source: CUDA stages it before returning, so `src` may be reused at once.
    check(cudaMemcpyAsync((float*)raw(id) + offset, src, n * 4, cudaMemcpyHostToDevice, stream_), "writing a buffer");
}

CudaBackend::Proj CudaBackend::proj(const std::string& w, const std::string& bias, int64_t n_out, int64_t y_col) const {
    const DevWeight& dw = weight(w);
    if (n_out > dw.rows)
        throw MinferError(strfmt("CUDA: %lld outputs from weight '%s' of %lld rows", (long long)n_out, w.c_str(),
                                 (long long)dw.rows));
    return Proj{&dw, bias.empty() ? nullptr : (const float*)weight(bias).p, n_out, y_col};
}

bool CudaBackend::project(const Node& node, const ExecArgs& a, const std::vector<Proj>& parts, bool swiglu,
                          const cuda::QkvRopeEpilogue* rope) {
    const int64_t K = parts[0].w->cols;
    for (const Proj& p : parts)
        if (p.w->cols != K) throw MinferError(strfmt("CUDA '%s': fused weights of different widths", node.name.c_str()));
    const int rows = node.rows;
    const float* x = at(a.in[0]);
    int64_t ldx = a.in[0].ld;
    float* y = at(a.out);
    const int64_t ldy = a.out.ld;
    if (rows <= kMatvecMaxRows) {  // decode: weights streamed once
        MatvecArgs m;
        m.n_parts = int(parts.size());
        m.swiglu = swiglu;
        m.K = K;
        bool q8 = decode_q8_;
        for (size_t i = 0; i < parts.size(); i++) {
            m.part[i] = MatvecPart{parts[i].w->p, parts[i].bias, row_bytes(parts[i].w->type, K), parts[i].w->type,
                                   parts[i].n_out, parts[i].y_col};
            q8 = q8 && cuda::matvec_q8_supported(parts[i].w->type, K);
        }
        m.n_rows = rows;
        m.y = y;
        m.ldy = ldy;
        if (q8) {  // activations rounded to 8 bits once, integer dot products
            m.x = x;
            m.ldx = ldx;
            float* sc = scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, K) + 3) / 4);
            const bool ready = pending_.x == x && pending_.ld == ldx && pending_.K == K && pending_.rows == rows;
            if (rope) {
                m.rope = *rope;
                if (!cuda::matvec_q8_rope_fusable(m)) m.rope = cuda::QkvRopeEpilogue{};
            }
            cuda::matvec_q8(m, sc, ready, stream_);
            return m.rope.pos != nullptr;
        }
        if (uintptr_t(x) % 16 || ldx % 4) {  // f32 activations; a column window at an odd offset: copy to aligned rows
            float* xa = scratch(fscratch_, fscratch_n_, size_t(rows) * size_t(K));
            cuda::copy_rows(x, ldx, xa, K, rows, int(K), stream_);
            x = xa;
            ldx = K;
        }
        m.x = x;
        m.ldx = ldx;
        cuda::matvec(m, stream_);
        return false;
    }
    // prefill: each weight dequantized to f16 once, then the tensor-core GEMM
    int64_t max_n = 0;
    for (const Proj& p : parts) max_n = std::max(max_n, p.n_out);
    __half* wh = scratch(wscratch_, wscratch_n_, size_t(max_n * K));
    __half* xh = scratch(xscratch_, xscratch_n_, size_t(int64_t(rows) * K));
    float* up = swiglu ? scratch(fscratch_, fscratch_n_, size_t(rows) * size_t(parts[1].n_out)) : nullptr;
    cuda::convert_f16(x, ldx, rows, K, xh, stream_);
    for (size_t i = 0; i < parts.size(); i++) {
        const Proj& p = parts[i];
        const int splits = gemm_splits(rows, p.n_out, K);
        float* partial = splits > 1 ? scratch(kscratch_, kscratch_n_, size_t(splits) * size_t(rows) * size_t(p.n_out))
                                    : nullptr;
        cuda::dequantize_f16(p.w->type, p.w->p, p.n_out, K, wh, stream_);
        if (swiglu && i == 1) cuda::gemm_f16(xh, wh, rows, p.n_out, K, up, p.n_out, nullptr, partial, stream_);
        else cuda::gemm_f16(xh, wh, rows, p.n_out, K, y + p.y_col, ldy, p.bias, partial, stream_);
    }
    if (swiglu) cuda::elementwise(Ew::SwiGLU, y, ldy, up, parts[1].n_out, y, ldy, rows, int(parts[1].n_out), stream_);
    return false;
}

void CudaBackend::execute_node(const Node& node, const ExecArgs& a) {
    usable();
    pending_ = prequant_;  // valid for this node only
    prequant_ = Prequant{};
    recent_[recent_at_] = node.name;
    recent_at_ = (recent_at_ + 1) % recent_.size();
    const NodeMeta& m = node.meta;
    const int rows = node.rows, cols = node.cols;
    auto ld = [&](size_t i) { return a.in[i].ld; };
    auto qkv_parts = [&] {  // FusedQKV, FusedQkvNorm, FusedQkvRope: q, k, v side by side
        return std::vector<Proj>{proj(m.wq, m.bq, m.q_cols, 0), proj(m.wk, m.bk, m.k_cols, m.q_cols),
                                 proj(m.wv, m.bv, m.v_cols, m.q_cols + m.k_cols)};
    };
    switch (node.op) {
        case Op::Input:
            return;
        case Op::GetRows: {
            const DevWeight& w = weight(m.weight);
            return cuda::get_rows(w.type, w.p, w.rows, w.cols, (const int32_t*)at(a.in[0]), rows, at(a.out), a.out.ld,
                                  err_dev_, stream_);
        }
        case Op::TailRow:
            return cuda::copy_rows(at(a.in[0]) + int64_t(m.src_row) * ld(0), ld(0), at(a.out), a.out.ld, 1, cols, stream_);
        case Op::RmsNorm: case Op::QkNorm: {
            cuda::Q8Act q8;  // decode's whole-row norm: also the next projection's 8-bit activations
            if (node.op == Op::RmsNorm && decode_q8_ && rows <= kMatvecMaxRows && cols % 64 == 0)
                q8 = cuda::q8_act(scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, cols) + 3) / 4),
                                  rows, cols);
            if (cuda::rmsnorm(at(a.in[0]), ld(0), at(a.out), a.out.ld, rows, cols,
                              node.op == Op::RmsNorm ? cols : m.head_dim, (const float*)weight(m.weight).p, m.eps, q8,
                              stream_))
                prequant_ = Prequant{at(a.out), a.out.ld, cols, rows};
            return;
        }
        case Op::MatMul:
            project(node, a, {proj(m.weight, m.bias, cols, 0)}, false);
            return;
        case Op::FusedQKV:
            project(node, a, qkv_parts(), false);
            return;
        case Op::FusedQkvRope: {  // decode: the matvec's end rotates and stores; else the separate kernel after it
            const int32_t* pos = (const int32_t*)at(a.in[1]);
            cuda::QkvRopeEpilogue e;
            e.pos = pos;
            e.head_dim = m.head_dim;
            e.rope_dim = m.rope_dim;
            e.n_ctx = m.n_ctx;
            e.base = m.rope_base;
            e.neox = m.rope_neox;
            e.kv_type = m.kv_type;
            e.K = raw(a.kv_k);
            e.V = raw(a.kv_v);
            e.err = err_dev_;
            if (project(node, a, qkv_parts(), false, &e))
                return;
            if (rows == 1 && qkv_rope_mode() == QkvRope::Epilogue)
                throw MinferError(strfmt("CUDA '%s': cuda.qkv_rope=epilogue, but this projection's matvec cannot "
                                         "rotate and store (%d rows, %s cache, head_dim %d, rope_dim %d)",
                                         node.name.c_str(), rows, type_traits(m.kv_type).name, m.head_dim, m.rope_dim));
            float* y = at(a.out);
            const int64_t ly = a.out.ld;
            cuda::RopeStoreShape sh{rows, m.q_cols, m.n_head_kv * m.head_dim, m.head_dim, m.rope_dim, m.rope_base,
                                    m.rope_neox, m.kv_type, m.n_ctx};
            return cuda::rope_kv_store(sh, y, ly, y + m.q_cols, ly, y + m.q_cols + m.k_cols, ly, pos, y, ly, raw(a.kv_k),
                                       raw(a.kv_v), err_dev_, stream_);
        }
        case Op::FusedQkvNorm: {  // the projections, then qwen3's per-head norms of q and k in place
            project(node, a, qkv_parts(), false);
            float* y = at(a.out);
            cuda::rmsnorm(y, a.out.ld, y, a.out.ld, rows, m.q_cols, m.head_dim, (const float*)weight(m.q_norm).p, m.eps,
                          cuda::Q8Act{}, stream_);
            cuda::rmsnorm(y + m.q_cols, a.out.ld, y + m.q_cols, a.out.ld, rows, m.k_cols, m.head_dim,
                          (const float*)weight(m.k_norm).p, m.eps, cuda::Q8Act{}, stream_);
            return;
        }
        case Op::FusedFFN:
            project(node, a, {proj(m.w_gate, "", cols, 0), proj(m.w_up, "", cols, 0)}, true);
            return;
        case Op::Rope:
            return cuda::rope(at(a.in[0]), ld(0), at(a.out), a.out.ld, (const int32_t*)at(a.in[1]), rows, cols,
                              m.head_dim, m.rope_dim, m.rope_base, m.rope_neox, stream_);
        case Op::KvStore:
            return cuda::kv_store(m.kv_type, at(a.in[0]), ld(0), at(a.in[1]), ld(1), (const int32_t*)at(a.in[2]), rows,
                                  m.n_head_kv * m.head_dim, m.n_ctx, raw(a.kv_k), raw(a.kv_v), err_dev_, stream_);
        case Op::AddRmsNorm: {
            const int n = cols / 2;
            cuda::Q8Act q8;  // decode: also the norm as the next projection's 8-bit activations
            if (decode_q8_ && rows <= kMatvecMaxRows && n % 64 == 0)
                q8 = cuda::q8_act(scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, n) + 3) / 4),
                                  rows, n);
            // whether the norm feeds a q/k/v projection, and whether its q rows are Q4_K (the pipe kernel's:
            // the launch rule of add_norm_kernel)
            const bool feeds_qkv = !m.feeds_q.empty();
            auto wq = feeds_qkv ? weights_.find(m.feeds_q) : weights_.end();
            const bool q4k = wq != weights_.end() && wq->second.type == GGML_TYPE_Q4_K;
            cuda::add_rmsnorm(at(a.in[0]), ld(0), at(a.in[1]), ld(1), at(a.out), a.out.ld, rows, n,
                              (const float*)weight(m.weight).p, m.eps, q8, stream_, feeds_qkv, q4k);
            if (q8.q) prequant_ = Prequant{at(a.out) + n, a.out.ld, n, rows};
            return;
        }
        case Op::RopeKvStore: {
            cuda::RopeStoreShape sh{rows, cols, m.n_head_kv * m.head_dim, m.head_dim, m.rope_dim, m.rope_base,
                                    m.rope_neox, m.kv_type, m.n_ctx};
            return cuda::rope_kv_store(sh, at(a.in[0]), ld(0), at(a.in[1]), ld(1), at(a.in[2]), ld(2),
                                       (const int32_t*)at(a.in[3]), at(a.out), a.out.ld, raw(a.kv_k), raw(a.kv_v),
                                       err_dev_, stream_);
        }
        case Op::Attn: {
            AttnShape s{rows, m.n_head, m.n_head_kv, m.head_dim, m.n_ctx, m.kv_type, m.attn_scale};
            const size_t need = attention_scratch_floats(s);
            float* sc = need ? scratch(ascratch_, ascratch_n_, need) : nullptr;
            cuda::Q8Act q8;  // decode with a combine step: also the output as the O projection's 8-bit activations
            if (decode_q8_ && rows <= kMatvecMaxRows && cols % 64 == 0 && m.head_dim % 32 == 0 &&
                cuda::attention_splits(s) > 1)
                q8 = cuda::q8_act(scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, cols) + 3) / 4),
                                  rows, cols);
            cuda::attention(s, at(a.in[0]), ld(0), (const int32_t*)at(a.in[1]), raw(a.kv_k), raw(a.kv_v), at(a.out),
                            a.out.ld, sc, err_dev_, q8, stream_);
            if (q8.q) prequant_ = Prequant{at(a.out), a.out.ld, cols, rows};
            return;
        }
        case Op::Add: case Op::Mul: case Op::SwiGLU:
            return cuda::elementwise(node.op == Op::Add ? Ew::Add : node.op == Op::Mul ? Ew::Mul : Ew::SwiGLU,
                                     at(a.in[0]), ld(0), at(a.in[1]), ld(1), at(a.out), a.out.ld, rows, cols, stream_);
        case Op::Silu:
            return cuda::elementwise(Ew::Silu, at(a.in[0]), ld(0), nullptr, 0, at(a.out), a.out.ld, rows, cols, stream_);
        default:
            throw MinferError(strfmt("CUDA backend cannot execute node '%s' (op %s)", node.name.c_str(), op_name(node.op)));
    }
}

// ---- graph capture ------------------------------------------------------------

bool CudaBackend::replay_split(uint64_t key) {
    usable();
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    recent_[recent_at_] = strfmt("graph replay of split %llu", (unsigned long long)(key & 0xfffff));
    recent_at_ = (recent_at_ + 1) % recent_.size();
    check(cudaGraphLaunch(it->second, stream_), "launching a recorded graph");
    return true;
}

bool CudaBackend::begin_capture(uint64_t key) {
    usable();
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

}  // namespace

CudaDeviceInfo cuda_device_info() {
    CudaDeviceInfo info;
    info.built = true;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        info.reason = e != cudaSuccess ? strfmt("no usable CUDA device (no NVIDIA GPU or driver?): %s", cudaGetErrorString(e))
                                       : std::string("no CUDA device found");
        return info;
    }
    cudaDeviceProp p{};
    if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) {
        info.reason = strfmt("cannot query CUDA device 0: %s", cudaGetErrorString(e));
        return info;
    }
    info.name = p.name;
    info.cc_major = p.major;
    info.cc_minor = p.minor;
    info.sm_count = p.multiProcessorCount;
    if (p.major < 7) {  // the tensor-core tiles need sm_70+
        info.reason = strfmt("%s has compute capability %d.%d; minfer's CUDA kernels need 7.0 or newer", p.name, p.major,
                             p.minor);
        return info;
    }
    cudaSetDevice(0);
    if ((e = cudaMemGetInfo(&info.free_bytes, &info.total_bytes)) != cudaSuccess) {
        info.reason = strfmt("cannot initialize CUDA device 0: %s", cudaGetErrorString(e));
        return info;
    }
    info.available = true;
    return info;
}

std::vector<std::string> cuda_unsupported_weights(const WeightStore& weights) {
    std::vector<std::string> out;
    for (auto& [name, w] : weights.all())
        if (!type_supported(w.type)) out.push_back(name + " (" + type_traits(w.type).name + ")");
    return out;
}

std::unique_ptr<Backend> make_cuda_backend(const WeightStore* weights, size_t reserve_bytes) {
    return std::make_unique<CudaBackend>(weights, reserve_bytes);
}

namespace {
// The kernel entry points below (cuda_matmul, cuda_copy_bandwidth) wait as the backend does: by polling an
// event, bounded by MINFER_GPU_TIMEOUT_S.  A wait that times out marks the call hung, and its device memory is
// then left allocated rather than freed (cudaFree would wait for the hung kernel; H200 run 135 lost 9.5 minutes
// to a hung test kernel behind a plain cudaDeviceSynchronize).
struct Waits {
    double timeout_s = gpu_timeout_s();
    bool hung = false;
    // Waits for event ev (recorded by the caller); what: the step, for the error.
    void on(cudaEvent_t ev, const char* what) {
        const cudaError_t e = wait_event(ev, timeout_s);
        if (e == cudaErrorNotReady) {
            hung = true;
            throw MinferError(strfmt("CUDA %s: the GPU did not finish within %g s (MINFER_GPU_TIMEOUT_S)", what,
                                     timeout_s));
        }
        if (e != cudaSuccess) throw MinferError(strfmt("CUDA %s: %s", what, cudaGetErrorString(e)));
    }
};
// Device memory freed on every path out of the entry points, unless their wait timed out (Waits).
struct DevMem {
    void* p = nullptr;
    const Waits& waits;
    DevMem(size_t bytes, const Waits& w) : waits(w) {
        check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "allocating test memory");
    }
    ~DevMem() {
        if (!waits.hung) cudaFree(p);
    }
};
struct Timer {
    cudaEvent_t a, b;
    Timer() { cudaEventCreate(&a); cudaEventCreate(&b); }
    ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
    double seconds(Waits& w) {
        w.on(b, "timing");
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        return ms / 1e3;
    }
};
}  // namespace

std::vector<float> cuda_matmul(uint32_t type, const uint8_t* w, size_t w_bytes, int64_t N, int64_t K, const float* x,
                               int rows, int iters, double* seconds_per_call, const std::string& path) {
    if (!cuda_device_info().available) throw MinferError(cuda_device_info().reason);
    if (!type_supported(type)) throw MinferError(strfmt("CUDA: weight type %s is not supported", type_traits(type).name));
    if (w_bytes != size_t(N) * row_size(type, K))
        throw MinferError(strfmt("cuda_matmul: %zu weight bytes for %lld rows of %lld %s values", w_bytes, (long long)N,
                                 (long long)K, type_traits(type).name));
    // The path the backend would take (auto), or one forced: f32 or q8 matvec (at most kMatvecMaxRows rows), gemm.
    std::string how = path;
    if (how == "auto")
        how = rows > kMatvecMaxRows ? "gemm" : decode_q8() && cuda::matvec_q8_supported(type, K) ? "q8" : "f32";
    if (how != "gemm" && how != "q8" && how != "f32")
        throw MinferError("cuda_matmul: path must be 'auto', 'f32', 'q8' or 'gemm', got '" + path + "'");
    if (how != "gemm" && rows > kMatvecMaxRows)
        throw MinferError(strfmt("cuda_matmul: the matvec paths take at most %d rows", kMatvecMaxRows));
    if (how == "q8" && !cuda::matvec_q8_supported(type, K))
        throw MinferError(strfmt("cuda_matmul: no 8-bit-activation matvec for %s at width %lld", type_traits(type).name,
                                 (long long)K));
    const size_t dev_w = size_t(N) * size_t(row_bytes(type, K));  // the upload's layout (lay_rows)
    Waits waits;  // before the memory: it outlives it
    DevMem dw(dev_w + 256, waits), dx(size_t(rows) * K * 4, waits), dy(size_t(rows) * N * 4, waits),
        wh(size_t(N) * K * 2, waits), xh(size_t(rows) * K * 2, waits),
        part(size_t(cuda::gemm_splits(rows, N, K)) * rows * N * 4, waits),
        xq(cuda::matvec_q8_scratch_bytes(rows, K), waits);
    std::vector<uint8_t> laid(dev_w);
    lay_rows(type, w, laid.data(), N, K);
    check(cudaMemcpy(dw.p, laid.data(), dev_w, cudaMemcpyHostToDevice), "uploading");
    check(cudaMemcpy(dx.p, x, size_t(rows) * K * 4, cudaMemcpyHostToDevice), "uploading");
    cudaStream_t s = nullptr;  // the legacy stream: these calls are synchronous anyway
    auto run = [&] {
        if (how != "gemm") {
            MatvecArgs m;
            m.part[0] = MatvecPart{(const uint8_t*)dw.p, nullptr, row_bytes(type, K), type, N, 0};
            m.K = K;
            m.x = (const float*)dx.p;
            m.ldx = K;
            m.n_rows = rows;
            m.y = (float*)dy.p;
            m.ldy = N;
            if (how == "q8") cuda::matvec_q8(m, xq.p, false, s);
            else cuda::matvec(m, s);
        } else {
            cuda::dequantize_f16(type, (const uint8_t*)dw.p, N, K, (__half*)wh.p, s);
            cuda::convert_f16((const float*)dx.p, K, rows, K, (__half*)xh.p, s);
            cuda::gemm_f16((const __half*)xh.p, (const __half*)wh.p, rows, N, K, (float*)dy.p, N, nullptr,
                           (float*)part.p, s);
        }
    };
    Timer t;
    run();
    check(cudaEventRecord(t.b, s), "recording an event");
    waits.on(t.b, "running the matmul");
    if (iters > 0) {
        cudaEventRecord(t.a, s);
        for (int i = 0; i < iters; i++) run();
        cudaEventRecord(t.b, s);
        *seconds_per_call = t.seconds(waits) / iters;
    }
    std::vector<float> y(size_t(rows) * size_t(N));
    check(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), "reading back");
    return y;
}

double cuda_copy_bandwidth(size_t bytes, int iters) {
    if (!cuda_device_info().available) throw MinferError(cuda_device_info().reason);
    Waits waits;
    DevMem a(bytes, waits), b(bytes, waits);
    Timer t;
    check(cudaMemsetAsync(a.p, 1, bytes, nullptr), "filling");
    check(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, nullptr), "warming up");
    check(cudaEventRecord(t.b, nullptr), "recording an event");
    waits.on(t.b, "warming up");
    cudaEventRecord(t.a, nullptr);
    for (int i = 0; i < iters; i++) cudaMemcpyAsync(i % 2 ? a.p : b.p, i % 2 ? b.p : a.p, bytes, cudaMemcpyDeviceToDevice, nullptr);
    cudaEventRecord(t.b, nullptr);
    return 2.0 * double(bytes) * iters / t.seconds(waits);
}

std::vector<int> cuda_argmax(const float* x, int n, int reps, bool* nan) {
    if (!cuda_device_info().available) throw MinferError(cuda_device_info().reason);
    if (n < 1 || reps < 1) throw MinferError(strfmt("cuda_argmax: %d values, %d runs (at least 1 of each)", n, reps));
    Waits waits;
    DevMem dx(size_t(n) * 4, waits), part(size_t(cuda::kArgmaxBlocks) * 8, waits), out(size_t(reps) * 4, waits),
        err(4, waits);
    cudaStream_t s = nullptr;
    check(cudaMemcpyAsync(dx.p, x, size_t(n) * 4, cudaMemcpyHostToDevice, s), "uploading");
    check(cudaMemsetAsync(err.p, 0, 4, s), "zeroing the error word");
    for (int i = 0; i < reps; i++)
        cuda::argmax((const float*)dx.p, n, (int*)out.p + i, part.p, (uint32_t*)err.p, s);
    Timer t;
    check(cudaEventRecord(t.b, s), "recording an event");
    waits.on(t.b, "running the argmax");
    std::vector<int> won(reps);
    uint32_t e = 0;
    check(cudaMemcpy(won.data(), out.p, size_t(reps) * 4, cudaMemcpyDeviceToHost), "reading back");
    check(cudaMemcpy(&e, err.p, 4, cudaMemcpyDeviceToHost), "reading back");
    *nan = (e & cuda::kNanLogit) != 0;
    return won;
}

}  // namespace minfer
