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
// Reference: tests/test_cuda.py (bounded waits, graph replay, mixed graphs, forward passes).
#include "backends/cuda/cuda_backend.cuh"
#include "graph/plan.h"

namespace minfer::cuda_host {

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
    split_counters_ = (int*)device_alloc(size_t(cuda::kGemmMmaCounters) * sizeof(int), "the split counters");
    check(cudaMemset(split_counters_, 0, size_t(cuda::kGemmMmaCounters) * sizeof(int)), "zeroing the split counters");
    check(cudaHostAlloc((void**)&chain_host_, kChainResults * sizeof(int32_t), cudaHostAllocMapped),
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
    cudaFree(split_counters_);
    cudaFreeHost(staging_);
    cudaFreeHost(host_buf_);
    cudaFreeHost(allow_host_);
    cudaFree(allow_dev_);
    cudaFreeHost(top_host_);
    cudaFree(top_part_);
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
    // the cache's kernels (a KV ring: the windowed attention kernel reads it, and only a local layer has one)
    const bool kv_ok = (node.meta.kv_type == GGML_TYPE_F16 || node.meta.kv_type == GGML_TYPE_F32 ||
                        node.meta.kv_type == GGML_TYPE_Q8_0) && node.meta.head_dim <= 256 &&
                       (node.meta.kv_ring == 0 || node.meta.window > 0);
    switch (node.op) {
        case Op::Input: case Op::TailRow: case Op::PickRows: case Op::Rope: case Op::Add: case Op::Mul: case Op::Silu: case Op::SwiGLU:
        case Op::Gelu: case Op::GeGLU: case Op::Scale: case Op::SoftCap:
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
    forget_prepared();
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
    if (host_buf_ && dst >= host_buf_ && dst + n <= host_buf_ + host_buf_floats_) {  // pinned already
        check(cudaMemcpyAsync(dst, (float*)raw(id) + offset, n * 4, cudaMemcpyDeviceToHost, stream_), "reading a buffer");
        return synchronize();
    }
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

float* CudaBackend::host_buffer(size_t n) {
    if (host_buf_) {
        if (n > host_buf_floats_)
            throw MinferError(strfmt("CUDA: the pinned host buffer holds %zu floats, %zu asked", host_buf_floats_, n));
        return host_buf_;
    }
    check(cudaHostAlloc((void**)&host_buf_, n * 4, cudaHostAllocDefault), "allocating a pinned host buffer");
    host_buf_floats_ = n;
    return host_buf_;
}

// The previous argmax has been waited for (each call ends in a wait), so the pinned copy is free to refill.
const uint32_t* CudaBackend::upload_allow(const uint32_t* allow, size_t words) {
    if (words > allow_words_) {
        synchronize();
        cudaFreeHost(allow_host_);
        cudaFree(allow_dev_);
        allow_host_ = allow_dev_ = nullptr;
        allow_words_ = 0;
        check(cudaHostAlloc((void**)&allow_host_, words * 4, cudaHostAllocDefault), "allocating the token masks");
        allow_dev_ = (uint32_t*)device_alloc(words * 4, "the token masks");
        allow_words_ = words;
    }
    std::memcpy(allow_host_, allow, words * 4);
    check(cudaMemcpyAsync(allow_dev_, allow_host_, words * 4, cudaMemcpyHostToDevice, stream_), "copying token masks");
    return allow_dev_;
}

int CudaBackend::argmax(int id, size_t offset, size_t n, const uint32_t* allow) {
    usable();
    const uint32_t* mask = allow ? upload_allow(allow, (n + 31) / 32) : nullptr;
    cuda::argmax((const float*)raw(id) + offset, int(n), argmax_dev_, argmax_part_, err_dev_, stream_, mask);
    synchronize();
    return *(volatile int*)argmax_host_;
}

// Every row's argmax enqueued (cuda::argmax_rows), then one wait (the winners land in the host-mapped chain buffer).
void CudaBackend::argmax_rows(int id, size_t offset, size_t n, int rows, size_t ld, int32_t* out,
                              const uint32_t* allow) {
    usable();
    const size_t words = (n + 31) / 32;
    const uint32_t* masks = allow ? upload_allow(allow, size_t(rows) * words) : nullptr;
    for (int r0 = 0; r0 < rows; r0 += kChainSteps) {
        const int m = std::min(kChainSteps, rows - r0);
        cuda::argmax_rows((const float*)raw(id) + offset + size_t(r0) * ld, int64_t(ld), int(n), m, (int*)chain_dev_,
                          argmax_part_, err_dev_, stream_, masks ? masks + size_t(r0) * words : nullptr,
                          int64_t(words));
        synchronize();
        std::memcpy(out + r0, (const void*)chain_host_, size_t(m) * sizeof(int32_t));
    }
}

// The winners land in host-mapped memory (k values and ids a row), read after one wait.
static_assert(cuda::kTopKMax == Plan::kTopKMax, "the device's top-k keeps what a plan may ask");
void CudaBackend::top_k_rows(int id, size_t offset, size_t n, int rows, size_t ld, int k, float* vals, int32_t* ids) {
    usable();
    if (rows < 1) return;
    if (offset + size_t(rows - 1) * ld + n > buffer_size(id))
        throw MinferError(strfmt("CUDA top-k: %d rows of %zu past the end of buffer %d", rows, n, id));
    const size_t out = size_t(rows) * size_t(k), bytes = out * 8, part = cuda::top_k_scratch_bytes(int(n), rows, k);
    if (bytes > top_bytes_ || part > top_part_bytes_) {
        synchronize();  // nothing in flight writes them
        cudaFreeHost(top_host_);
        cudaFree(top_part_);
        top_host_ = top_dev_ = top_part_ = nullptr;
        top_bytes_ = top_part_bytes_ = 0;
        check(cudaHostAlloc(&top_host_, bytes, cudaHostAllocMapped), "allocating the top-k results");
        check(cudaHostGetDevicePointer(&top_dev_, top_host_, 0), "mapping the top-k results");
        top_bytes_ = bytes;
        if (part) top_part_ = device_alloc(part, "the top-k scratch");
        top_part_bytes_ = part;
    }
    cuda::top_k_rows((const float*)raw(id) + offset, int64_t(ld), int(n), rows, k, (float*)top_dev_,
                     (int32_t*)((float*)top_dev_ + out), top_part_, err_dev_, stream_);
    synchronize();
    std::memcpy(vals, top_host_, out * 4);
    std::memcpy(ids, (const float*)top_host_ + out, out * 4);
}

// The steps follow each other with no host write between them: the step's first kernel (the embedding
// gather) waits for the argmax before it lets the rest of the step start (pdl_wait_then_release), so the
// kernels that read the token and position before their own waits see this step's.  The argmax kernel writes
// each row's token, position and slot.
bool CudaBackend::greedy_chain_rows(int steps, const std::function<void()>& step, int id, size_t offset, size_t n,
                                    int rows, size_t ld, const ChainInputs& in, int32_t* out) {
    usable();
    if (rows < 1 || rows > kChainResults || in.token < 0 || in.pos < 0 || (in.slot >= 0) != (in.tables >= 0) ||
        (in.slot >= 0 && (in.block_size < 1 || in.max_blocks < 1)))
        throw MinferError(strfmt("CUDA greedy chain: %d rows, or its inputs are not a batch step's", rows));
    auto ptr = [&](int b) { return b >= 0 ? (int32_t*)raw(b) : nullptr; };
    const int per_wait = std::min(kChainSteps, kChainResults / rows);
    for (int done = 0; done < steps;) {
        const int m = std::min(per_wait, steps - done);
        for (int i = 0; i < m; i++) {
            step();
            const cuda::ArgmaxFeed feed{ptr(in.token), ptr(in.pos), chain_dev_ + size_t(i) * size_t(rows),
                                        ptr(in.slot), ptr(in.tables), in.block_size, in.max_blocks};
            cuda::argmax_rows_feed((const float*)raw(id) + offset, int64_t(ld), int(n), rows, feed, argmax_part_,
                                   err_dev_, stream_);
        }
        synchronize();
        std::memcpy(out + size_t(done) * size_t(rows), (const void*)chain_host_, size_t(m) * size_t(rows) * sizeof(int32_t));
        done += m;
    }
    return true;
}

void CudaBackend::write_host(int id, size_t offset, const float* src, size_t n) {
    usable();
    forget_prepared();
    // Pageable source: CUDA stages it before returning, so `src` may be reused at once.
    check(cudaMemcpyAsync((float*)raw(id) + offset, src, n * 4, cudaMemcpyHostToDevice, stream_), "writing a buffer");
}

}  // namespace minfer::cuda_host

namespace minfer {

using cuda_host::CudaBackend;
using namespace cuda;

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

}  // namespace minfer
