// The Metal backend: the Backend contract over one Apple GPU (this file; each node's encoding is in
// metal_execute.mm, the declarations both share in metal_backend.h).
//
// * One process-wide device state (MetalDevice): the device, a command queue,
//   the kernel library (minfer.metallib next to the extension, or
//   $MINFER_METALLIB) and its pipelines, created on first use.
// * Weights are zero-copy: each mapped GGUF file is wrapped whole with
//   newBufferWithBytesNoCopy (the mapping is page-aligned and outlives the
//   buffer) and every weight is registered by name as (buffer, offset); where
//   the OS refuses, the file is copied into a shared buffer instead.  A read
//   of one byte per page at load warms the mapping.
// * Activations live in shared-storage buffers: read_host / write_host are
//   memcpys through -contents (after the GPU is idle).
// * execute_node encodes into one compute encoder of one command buffer per
//   split, with a buffer barrier between dispatches; synchronize commits it
//   and waits for its completion handler with a bound (MINFER_GPU_TIMEOUT_S,
//   default 10 s).  A timeout or a command-buffer error names the last
//   dispatches and leaves the backend refusing work.
// * Before any dispatch, the shape is checked against the pipeline's and the
//   device's limits and against the bound buffers' lengths; a violation is an
//   invariant failure of minfer itself: a loud abort with the numbers, never
//   a launch that would overrun.
//
// Verified on Linux only by type-checking against a stub Metal header and by
// running the kernels in the MSL emulator (metal/README.md says what a Mac
// must still confirm).
#include "backends/metal/metal_backend.h"

namespace minfer {

namespace metal_host {

[[noreturn]] void invariant_failure(const std::string& what) {
    std::fprintf(stderr, "minfer: Metal invariant violated, refusing to launch: %s\n", what.c_str());
    std::abort();
}

const char* type_suffix(uint32_t t) {
    switch (t) {
        case GGML_TYPE_F32: return "f32";
        case GGML_TYPE_F16: return "f16";
        case GGML_TYPE_Q4_0: return "q4_0";
        case GGML_TYPE_Q4_1: return "q4_1";
        case GGML_TYPE_Q5_0: return "q5_0";
        case GGML_TYPE_Q5_1: return "q5_1";
        case GGML_TYPE_Q8_0: return "q8_0";
        case GGML_TYPE_Q4_K: return "q4_K";
        case GGML_TYPE_Q5_K: return "q5_K";
        case GGML_TYPE_Q6_K: return "q6_K";
        default: return nullptr;
    }
}

MetalBackend::MetalBackend(const WeightStore* weights) : dev_(MetalDevice::get()) {
    if (!dev_.error.empty()) throw MinferError("Metal: " + dev_.error);
    timeout_s_ = gpu_timeout_s();
    cpu_ops_ = cpu_ops_setting();
    const std::string tier = forced_kernel("metal.matmul");  // tests force one tier for every row count
    if (tier == "matvec") rows_min_ = mm_min_rows_ = UINT32_MAX;
    else if (tier == "rows") rows_min_ = 1, mm_min_rows_ = UINT32_MAX;
    else if (tier == "simdgroup") rows_min_ = mm_min_rows_ = 1;
    if (const std::string attn = forced_kernel("metal.attention"); !attn.empty()) attn_split_ = attn == "split";
    recent_.resize(8);
    @autoreleasepool {
        // Zero-copy weights: one no-copy buffer per mapped file, warmed by touching each page.
        const size_t page = size_t(getpagesize());
        std::map<const uint8_t*, std::pair<id<MTLBuffer>, const uint8_t*>> by_file;
        for (const auto& f : weights->gguf().files()) {
            const uint8_t* base = f->data();
            const size_t len = (f->size() + page - 1) / page * page;
            volatile uint8_t sink = 0;
            for (size_t o = 0; o < f->size(); o += page) sink ^= base[o];
            (void)sink;
            id<MTLBuffer> b = nil;
            if (uintptr_t(base) % page == 0)
                b = [dev_.device newBufferWithBytesNoCopy:(void*)base length:len
                                                  options:MTLResourceStorageModeShared deallocator:nil];
            if (!b)  // not page-aligned (an in-memory model) or refused: copy
                b = [dev_.device newBufferWithBytes:base length:f->size() options:MTLResourceStorageModeShared];
            if (!b) throw OutOfMemoryError(strfmt("Metal: could not map or copy %s (%zu bytes)", f->path().c_str(), f->size()));
            file_buffers_.push_back(b);
            by_file[base] = {b, base + f->size()};
        }
        for (auto& [name, w] : weights->all()) {
            for (auto& [base, entry] : by_file)
                if (w.data >= base && w.data + w.nbytes <= entry.second) {
                    weights_[name] = MetalWeight{entry.first, size_t(w.data - base), w.nbytes, w.type, w.rows(), w.cols()};
                    break;
                }
        }
        err_ = [dev_.device newBufferWithLength:4 options:MTLResourceStorageModeShared];
        std::memset([err_ contents], 0, 4);
        token_ = [dev_.device newBufferWithLength:4 options:MTLResourceStorageModeShared];
    }
}

MetalBackend::~MetalBackend() {
    if (cmd_ && !failed_) {
        try {
            synchronize();
        } catch (...) {
        }
    }
}

bool MetalBackend::supports_op(const Node& node) const {
    auto has = [&](const std::string& w, bool f32_only) {
        auto it = weights_.find(w);
        return it != weights_.end() && (f32_only ? it->second.type == GGML_TYPE_F32 : type_suffix(it->second.type) != nullptr);
    };
    if (cpu_ops_.count(node.op)) return false;
    switch (node.op) {
        case Op::Input: case Op::TailRow: case Op::Rope: case Op::Add: case Op::Mul: case Op::Silu: case Op::SwiGLU:
        case Op::Gelu: case Op::GeGLU: case Op::Scale: case Op::SoftCap:
            return true;
        case Op::RmsNorm: case Op::QkNorm: case Op::AddRmsNorm:
            return has(node.meta.weight, true);
        case Op::MatMul:
            return has(node.meta.weight, false) && weights_.at(node.meta.weight).cols % 32 == 0 &&
                   (node.meta.bias.empty() || has(node.meta.bias, true));
        case Op::GetRows:
            return has(node.meta.weight, false);
        case Op::FusedQKV: case Op::FusedQkvNorm: case Op::FusedFFN: {
            const NodeMeta& m = node.meta;
            const bool ffn = node.op == Op::FusedFFN;
            for (const std::string* w : ffn ? std::vector<const std::string*>{&m.w_gate, &m.w_up}
                                            : std::vector<const std::string*>{&m.wq, &m.wk, &m.wv})
                if (!has(*w, false) || weights_.at(*w).cols % 32) return false;
            for (const std::string* b : {&m.bq, &m.bk, &m.bv})
                if (!ffn && !b->empty() && !has(*b, true)) return false;
            return node.op != Op::FusedQkvNorm || (has(m.q_norm, true) && has(m.k_norm, true));
        }
        case Op::PickRows:  // (get_rows_f32 over the activations: 8 values a thread)
            return node.cols % 8 == 0;
        case Op::KvStore: case Op::Attn: case Op::RopeKvStore:  // a batch step's too: its pool, tables and slots
            return (node.meta.kv_type == GGML_TYPE_F32 || node.meta.kv_type == GGML_TYPE_F16 ||
                    (node.meta.kv_type == GGML_TYPE_Q8_0 && node.meta.n_head_kv * node.meta.head_dim % 32 == 0)) &&
                   node.meta.head_dim <= 256;
        default:
            return false;
    }
}

int MetalBackend::add_buffer(size_t bytes, const char* what) {
    id<MTLBuffer> b = [dev_.device newBufferWithLength:std::max<size_t>(bytes, 16) options:MTLResourceStorageModeShared];
    if (!b) throw OutOfMemoryError(strfmt("Metal: %s of %zu bytes could not be allocated", what, bytes));
    bufs_.push_back(Buf{b, bytes, false});
    return int(bufs_.size()) - 1;
}

int MetalBackend::alloc_buffer(size_t n) {
    for (size_t i = 0; i < bufs_.size(); i++)
        if (bufs_[i].free && bufs_[i].bytes == n * 4) {
            bufs_[i].free = false;
            return int(i);
        }
    return alloc_fresh(n);
}

int MetalBackend::alloc_fresh(size_t n) { return add_buffer(n * 4, "an activation buffer"); }

int MetalBackend::alloc_kv(size_t bytes) {
    const int id = add_buffer((bytes + 3) / 4 * 4, "a KV cache region");
    std::memset([bufs_[size_t(id)].b contents], 0, bufs_[size_t(id)].bytes);
    return id;
}

Bound MetalBackend::at(const BufRef& r, int64_t rows, int64_t cols) const {
    const Buf& b = bufs_.at(size_t(r.id));
    const size_t first = size_t(r.offset) * 4, span = (rows > 0 ? size_t((rows - 1) * r.ld + cols) : 0) * 4;
    return Bound{b.b, first, span};
}

const MetalWeight& MetalBackend::weight(const std::string& name) const {
    auto it = weights_.find(name);
    if (it == weights_.end()) throw MinferError("Metal: weight '" + name + "' is not registered");
    return it->second;
}

void MetalBackend::usable() const {
    if (failed_) throw MinferError("Metal backend is unusable after an earlier failure: " + failure_);
}

void MetalBackend::fail(const std::string& what) {
    failed_ = true;
    std::string last;
    for (size_t i = 0; i < recent_.size(); i++) {
        const std::string& n = recent_[(recent_at_ + i) % recent_.size()];
        if (!n.empty()) last += (last.empty() ? "" : ", ") + n;
    }
    failure_ = what + "; last dispatches: " + (last.empty() ? "(none)" : last);
    throw MinferError("Metal: " + failure_);
}

id<MTLComputeCommandEncoder> MetalBackend::encoder() {
    if (!cmd_) {
        cmd_ = [dev_.queue commandBuffer];
        enc_ = [cmd_ computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
    }
    return enc_;
}

void MetalBackend::dispatch(const char* kernel, const void* args, size_t args_bytes, const std::vector<Bound>& bufs,
                            MTLSize grid, MTLSize tg, const std::vector<size_t>& tg_mem) {
    usable();
    id<MTLComputePipelineState> p = dev_.pipeline(kernel);
    const size_t threads = tg.width * tg.height * tg.depth;
    if (threads == 0 || threads > [p maxTotalThreadsPerThreadgroup])
        invariant_failure(strfmt("%s: %zu threads per threadgroup (pipeline limit %zu)", kernel, threads,
                                 size_t([p maxTotalThreadsPerThreadgroup])));
    size_t tg_total = [p staticThreadgroupMemoryLength];
    for (size_t m : tg_mem) tg_total += (m + 15) / 16 * 16;
    if (tg_total > [dev_.device maxThreadgroupMemoryLength])
        invariant_failure(strfmt("%s: %zu bytes of threadgroup memory (device limit %zu)", kernel, tg_total,
                                 size_t([dev_.device maxThreadgroupMemoryLength])));
    for (size_t i = 0; i < bufs.size(); i++)
        if (bufs[i].offset + bufs[i].bytes > [bufs[i].buffer length])
            invariant_failure(strfmt("%s: buffer(%zu) window [%zu, %zu) past its length %zu", kernel, i + 1,
                                     bufs[i].offset, bufs[i].offset + bufs[i].bytes, size_t([bufs[i].buffer length])));
    @autoreleasepool {
    id<MTLComputeCommandEncoder> e = encoder();
    [e setComputePipelineState:p];
    [e setBytes:args length:args_bytes atIndex:0];
    for (size_t i = 0; i < bufs.size(); i++) [e setBuffer:bufs[i].buffer offset:bufs[i].offset atIndex:i + 1];
    for (size_t i = 0; i < tg_mem.size(); i++) [e setThreadgroupMemoryLength:(tg_mem[i] + 15) / 16 * 16 atIndex:i];
    [e dispatchThreadgroups:grid threadsPerThreadgroup:tg];
    [e memoryBarrierWithScope:MTLBarrierScopeBuffers];  // the next dispatch may read what this one wrote
    }
    recent_[recent_at_] = kernel;
    recent_at_ = (recent_at_ + 1) % recent_.size();
}

void MetalBackend::synchronize() {
    usable();
    if (!cmd_) return;
    @autoreleasepool {
    [enc_ endEncoding];
    dispatch_semaphore_t done = dispatch_semaphore_create(0);
    [cmd_ addCompletedHandler:^(id<MTLCommandBuffer>) {
      dispatch_semaphore_signal(done);
    }];
    [cmd_ commit];
    id<MTLCommandBuffer> cmd = cmd_;
    cmd_ = nil;
    enc_ = nil;
    if (dispatch_semaphore_wait(done, dispatch_time(DISPATCH_TIME_NOW, int64_t(timeout_s_ * double(NSEC_PER_SEC)))) != 0)
        fail(strfmt("the GPU did not finish within %.1f s (MINFER_GPU_TIMEOUT_S)", timeout_s_));
    if ([cmd status] == MTLCommandBufferStatusError)
        fail("the command buffer failed: " + ns([[cmd error] localizedDescription]));
    }
    uint32_t* e = (uint32_t*)[err_ contents];
    if (*e) {
        const uint32_t bits = *e;
        *e = 0;
        throw MinferError(strfmt("Metal: invalid input found on the device:%s%s",
                                 bits & 1 ? " a token id is out of range of the embedding" : "",
                                 bits & 2 ? " a position is outside the KV cache" : ""));
    }
}

void MetalBackend::read_host(int id, size_t offset, float* dst, size_t n) {
    synchronize();  // shared storage: the contents are current once the GPU is idle
    std::memcpy(dst, (const float*)[bufs_.at(size_t(id)).b contents] + offset, n * 4);
}

int MetalBackend::argmax(int id, size_t offset, size_t n, const uint32_t* allow) {
    if (allow) return Backend::argmax(id, offset, n, allow);  // a constrained token: the logits' scan on the host
    const uint count = uint(n);
    dispatch("argmax", &count, sizeof count, {Bound{bufs_.at(size_t(id)).b, offset * 4, n * 4}, Bound{token_, 0, 4}},
             MTLSizeMake(1, 1, 1), MTLSizeMake(1024, 1, 1), {32 * 4, 32 * 4});
    synchronize();
    const int t = *(const int*)[token_ contents];
    if (t < 0) throw MinferError("Metal: a logit is NaN (the model produced NaN)");
    return t;
}

void MetalBackend::write_host(int id, size_t offset, const float* src, size_t n) {
    synchronize();
    std::memcpy((float*)[bufs_.at(size_t(id)).b contents] + offset, src, n * 4);
}

id<MTLBuffer> MetalBackend::rope_freqs(int rope_dim, float base, float scale) {  // scale: linear RoPE scaling
    auto key = std::make_tuple(rope_dim, base, scale);
    auto it = freqs_.find(key);
    if (it != freqs_.end()) return it->second;
    std::vector<float> f(size_t(rope_dim / 2));
    for (int i = 0; i < rope_dim / 2; i++) f[size_t(i)] = float(double(scale) * std::pow(double(base), -2.0 * i / rope_dim));  // double, as the reference
    id<MTLBuffer> b = [dev_.device newBufferWithBytes:f.data() length:f.size() * 4 options:MTLResourceStorageModeShared];
    freqs_[key] = b;
    return b;
}

MetalBackend::Part MetalBackend::part(const std::string& w, const std::string& bias, uint n, uint y_col) const {
    return Part{&weight(w), bias.empty() ? nullptr : &weight(bias), n, y_col};
}

id<MTLBuffer> MetalBackend::scratch(size_t bytes) {
    if (!scratch_ || [scratch_ length] < bytes)  // an encoded dispatch keeps the old buffer alive (retained)
        scratch_ = [dev_.device newBufferWithLength:bytes options:MTLResourceStorageModeShared];
    if (!scratch_) throw OutOfMemoryError(strfmt("Metal: a scratch buffer of %zu bytes could not be allocated", bytes));
    return scratch_;
}

}  // namespace metal_host

MetalDeviceInfo metal_device_info() {
    MetalDeviceInfo info;
    info.built = true;
    metal_host::MetalDevice& d = metal_host::MetalDevice::get();
    info.available = d.error.empty();
    info.reason = d.error;
    if (d.device) info.name = metal_host::ns([d.device name]);
    return info;
}

std::unique_ptr<Backend> make_metal_backend(const WeightStore* weights) {
    return std::make_unique<metal_host::MetalBackend>(weights);
}

}  // namespace minfer
