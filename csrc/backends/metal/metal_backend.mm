// The Metal backend: the Backend contract over one Apple GPU.
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
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <dispatch/dispatch.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backends/kernel_choice.h"
#include "backends/offload.h"
#include "common/settings.h"
#include "backends/metal/metal_api.h"
#include "common/error.h"
#include "quant/types.h"

// The argument structs shared with metal/*.metal (global, as in the kernels).
#include "args.h"  // metal/args.h (the metal/ folder is on the include path)

namespace minfer {

namespace {

[[noreturn]] void invariant_failure(const std::string& what) {
    std::fprintf(stderr, "minfer: Metal invariant violated, refusing to launch: %s\n", what.c_str());
    std::abort();
}

std::string ns(NSString* s) { return s ? std::string([s UTF8String]) : std::string(); }

// ---- the process-wide device state -------------------------------------------------

struct MetalDevice {
    id<MTLDevice> device = nil;
    id<MTLCommandQueue> queue = nil;
    id<MTLLibrary> library = nil;
    std::string error;
    std::mutex mu;
    std::map<std::string, id<MTLComputePipelineState>> pipelines;

    static MetalDevice& get() {
        static MetalDevice d;
        static std::once_flag once;
        std::call_once(once, [] { d.init(); });
        return d;
    }

    static std::string library_path() {
        if (std::string p = setting_text("MINFER_METALLIB"); !p.empty()) return p;
        Dl_info info;
        if (dladdr((const void*)&metal_device_info, &info) && info.dli_fname) {
            std::string dir = info.dli_fname;
            dir = dir.substr(0, dir.rfind('/') + 1);
            return dir + "minfer.metallib";
        }
        return "minfer.metallib";
    }

    void init() {
        @autoreleasepool {
            device = MTLCreateSystemDefaultDevice();
            if (!device) {
                error = "no Metal device";
                return;
            }
            queue = [device newCommandQueue];
            const std::string path = library_path();
            NSError* err = nil;
            library = [device newLibraryWithURL:[NSURL fileURLWithPath:[NSString stringWithUTF8String:path.c_str()]]
                                          error:&err];
            if (!library)
                error = "the Metal kernel library " + path + " could not be loaded: " +
                        ns(err ? [err localizedDescription] : nil);
        }
    }

    id<MTLComputePipelineState> pipeline(const std::string& name) {
        std::lock_guard<std::mutex> lock(mu);
        auto it = pipelines.find(name);
        if (it != pipelines.end()) return it->second;
        @autoreleasepool {
        id<MTLFunction> fn = [library newFunctionWithName:[NSString stringWithUTF8String:name.c_str()]];
        if (!fn) throw MinferError("Metal: the kernel library has no function '" + name + "'");
        NSError* err = nil;
        id<MTLComputePipelineState> p = [device newComputePipelineStateWithFunction:fn error:&err];
        if (!p)
            throw MinferError("Metal: building the pipeline for '" + name +
                              "' failed: " + ns(err ? [err localizedDescription] : nil));
        pipelines[name] = p;
        return p;
        }
    }
};

// ---- the backend ------------------------------------------------------------------------

struct MetalWeight {
    id<MTLBuffer> buffer = nil;
    size_t offset = 0, nbytes = 0;
    uint32_t type = 0;
    int64_t rows = 0, cols = 0;
};

struct Bound {  // a buffer argument of a dispatch: what is bound, and how much of it the kernel may touch
    id<MTLBuffer> buffer;
    size_t offset, bytes;
};

// Threads of an RMSNorm threadgroup: one simdgroup for a head, more for a whole row.
uint norm_threads(uint width) { return width >= 1024 ? 256 : width >= 256 ? 128 : 32; }

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

class MetalBackend : public Backend {
  public:
    explicit MetalBackend(const WeightStore* weights);
    ~MetalBackend() override;
    const char* name() const override { return "metal"; }
    bool supports_op(const Node& node) const override;
    bool supports_fused(Op fused) const override {
        return fused == Op::SwiGLU || fused == Op::FusedQKV || fused == Op::FusedQkvNorm || fused == Op::FusedFFN ||
               fused == Op::RopeKvStore || fused == Op::AddRmsNorm;
    }
    bool has_weight(const std::string& name) const override { return weights_.count(name) != 0; }

    int alloc_buffer(size_t n_floats) override;
    void free_buffer(int id) override { bufs_.at(size_t(id)).free = true; }
    int alloc_fresh(size_t n_floats) override;
    int alloc_kv(size_t bytes) override;
    size_t buffer_size(int id) const override { return bufs_.at(size_t(id)).bytes / 4; }

    void execute_node(const Node& node, const ExecArgs& args) override;
    void read_host(int id, size_t offset, float* dst, size_t n) override;
    void write_host(int id, size_t offset, const float* src, size_t n) override;
    void synchronize() override;
    int argmax(int id, size_t offset, size_t n, const uint32_t* allow = nullptr) override;

  private:
    struct Buf {
        id<MTLBuffer> b = nil;
        size_t bytes = 0;
        bool free = false;
    };
    int add_buffer(size_t bytes, const char* what);
    Bound at(const BufRef& r, int64_t rows, int64_t cols) const;  // rows x cols floats from r
    Bound whole(int id) const { return Bound{bufs_.at(size_t(id)).b, 0, bufs_.at(size_t(id)).bytes}; }
    const MetalWeight& weight(const std::string& name) const;
    id<MTLComputeCommandEncoder> encoder();
    void dispatch(const char* kernel, const void* args, size_t args_bytes, const std::vector<Bound>& bufs,
                  MTLSize grid, MTLSize tg, const std::vector<size_t>& tg_mem = {});
    void usable() const;
    [[noreturn]] void fail(const std::string& what);
    id<MTLBuffer> rope_freqs(int rope_dim, float base, float scale);
    struct Part {  // one weight of a (possibly fused) projection and where its columns go
        const MetalWeight* w;
        const MetalWeight* bias;  // nullptr: none
        uint n, y_col;
    };
    Part part(const std::string& w, const std::string& bias, uint n, uint y_col) const;
    void project(const Node& node, const ExecArgs& a, const std::vector<Part>& parts, bool swiglu);
    void matvec_group(const char* tier, uint rows, const BufRef& x, const Bound& out, uint y_ld, const Part* p, size_t n,
                      bool swiglu);
    id<MTLBuffer> scratch(size_t bytes);

    MetalDevice& dev_;
    std::map<std::string, MetalWeight> weights_;
    std::vector<id<MTLBuffer>> file_buffers_;
    std::vector<Buf> bufs_;
    id<MTLBuffer> err_ = nil;  // uint32 error word the kernels set (bad token id, bad position)
    id<MTLBuffer> token_ = nil;  // the argmax kernel's int result
    id<MTLBuffer> partial_ = nil;  // attention_split's partials
    id<MTLBuffer> scratch_ = nil;  // the up projection of a FusedFFN whose gate and up cannot share a dispatch
    bool attn_split_ = true;       // the KV-split decode kernel where it applies (kernel choice metal.attention)
    // Matmul tiers by activation rows: [1, rows_min_) single-token, [rows_min_, mm_min_rows_) small batch,
    // the rest the simdgroup-matrix GEMM.  Not measured on a Mac: one row is what the single-token kernel is
    // for; past 8 rows the small-batch kernel reads each weight once per group of 8, so the GEMM tile takes
    // over (kernel choice metal.matmul forces one tier).
    uint rows_min_ = 2, mm_min_rows_ = 9;
    id<MTLCommandBuffer> cmd_ = nil;
    id<MTLComputeCommandEncoder> enc_ = nil;
    std::map<std::tuple<int, float, float>, id<MTLBuffer>> freqs_;
    std::vector<std::string> recent_;
    size_t recent_at_ = 0;
    std::set<Op> cpu_ops_;  // MINFER_CPU_OPS: ops left to the CPU (mixed graphs)
    double timeout_s_ = 10.0;
    bool failed_ = false;
    std::string failure_;
};

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

// One dispatch of a matvec tier over n parts that share a type and a buffer (so one kernel reads them all at
// byte offsets from the lowest); their biases, if any, likewise from one buffer.
void MetalBackend::matvec_group(const char* tier, uint rows, const BufRef& x, const Bound& out, uint y_ld,
                                const Part* p, size_t n, bool swiglu) {
    const MetalWeight& w0 = *p[0].w;
    const uint K = uint(w0.cols), rb = uint(w0.nbytes / size_t(w0.rows));
    size_t lo = SIZE_MAX, hi = 0, blo = SIZE_MAX, bhi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = std::min(lo, p[i].w->offset);
        hi = std::max(hi, p[i].w->offset + p[i].w->nbytes);
        if (p[i].bias) {
            blo = std::min(blo, p[i].bias->offset);
            bhi = std::max(bhi, p[i].bias->offset + size_t(p[i].n) * 4);
        }
    }
    uint w_off[3] = {0, 0, 0}, b_off[3] = {0, 0, 0}, end[3] = {0, 0, 0}, total = 0;
    for (size_t i = 0; i < n; i++) {
        w_off[i] = uint(p[i].w->offset - lo);
        if (p[i].bias) b_off[i] = uint((p[i].bias->offset - blo) / 4);
        total = swiglu ? p[0].n : total + p[i].n;
        end[i] = total;
    }
    const bool bias = p[0].bias != nullptr;
    MatvecArgs mv{K, total, rb, uint(x.ld), y_ld, rows, n > 1 && !swiglu ? end[0] : total,
                  n > 2 ? end[1] : total, w_off[0], w_off[1], w_off[2], bias ? 1u : 0u, b_off[0], b_off[1], b_off[2],
                  swiglu ? 1u : 0u};
    const Bound wb{w0.buffer, lo, hi - lo};
    const Bound bb = bias ? Bound{p[0].bias->buffer, blo, bhi - blo} : wb;  // unread without a bias
    const bool small = std::strcmp(tier, "matvec") == 0;
    const std::string k = std::string(tier) + "_" + type_suffix(w0.type);
    dispatch(k.c_str(), &mv, sizeof mv, {wb, at(x, rows, K), out, bb},
             MTLSizeMake((total + 3) / 4, small ? rows : (rows + 7) / 8, 1), MTLSizeMake(128, 1, 1));
}

// x W^T (+ bias) for one weight or a fused set: q|k|v into adjacent column windows, or gate/up with SwiGLU.
// Decode and small batches: the matvec tiers, parts that can share a dispatch sharing one; larger batches:
// the simdgroup-matrix GEMM per part, then the bias and SwiGLU elementwise.
void MetalBackend::project(const Node& node, const ExecArgs& a, const std::vector<Part>& parts, bool swiglu) {
    const uint rows = uint(node.rows), K = uint(parts[0].w->cols);
    for (const Part& p : parts)
        if (uint(p.w->cols) != K)
            throw MinferError(strfmt("Metal '%s': fused weights of different widths", node.name.c_str()));
    const uint y_ld = uint(a.out.ld);
    auto window = [&](uint col, uint n) {  // columns [col, col + n) of the output
        BufRef r = a.out;
        r.offset += col;
        return at(r, rows, n);
    };
    const uint up_n = swiglu ? parts[1].n : 0;
    id<MTLBuffer> up = nil;  // where the up projection goes when it is not fused with the gate
    if (rows < mm_min_rows_) {
        const char* tier = rows < rows_min_ ? "matvec" : "matmul_rows";
        auto joins = [&](const Part& g, const Part& p) {  // can p share g's dispatch?
            return p.w->type == g.w->type && p.w->buffer == g.w->buffer && (p.bias != nullptr) == (g.bias != nullptr) &&
                   (!p.bias || p.bias->buffer == g.bias->buffer) && p.w->nbytes / size_t(p.w->rows) == g.w->nbytes / size_t(g.w->rows) &&
                   std::max(p.w->offset + p.w->nbytes, g.w->offset + g.w->nbytes) - std::min(p.w->offset, g.w->offset) <= UINT32_MAX;
        };
        if (swiglu && joins(parts[0], parts[1]))
            return matvec_group(tier, rows, a.in[0], window(0, parts[0].n), y_ld, parts.data(), 2, true);
        if (swiglu) {  // gate into the output, up into scratch, then silu(gate) * up
            up = scratch(size_t(rows) * up_n * 4);
            matvec_group(tier, rows, a.in[0], window(0, parts[0].n), y_ld, &parts[0], 1, false);
            matvec_group(tier, rows, a.in[0], Bound{up, 0, size_t(rows) * up_n * 4}, up_n, &parts[1], 1, false);
        } else {
            for (size_t i = 0; i < parts.size();) {  // consecutive parts that can share a dispatch
                size_t n = 1;
                while (i + n < parts.size() && n < 3 && joins(parts[i], parts[i + n])) n++;
                uint width = 0;
                for (size_t j = i; j < i + n; j++) width += parts[j].n;
                matvec_group(tier, rows, a.in[0], window(parts[i].y_col, width), y_ld, &parts[i], n, false);
                i += n;
            }
            return;
        }
    } else {
        if (swiglu) up = scratch(size_t(rows) * up_n * 4);
        for (size_t i = 0; i < parts.size(); i++) {  // the simdgroup-matrix tier: 32 x 64 output tiles
            const Part& p = parts[i];
            const MetalWeight& w = *p.w;
            const size_t rb = w.nbytes / size_t(w.rows);
            const bool to_up = swiglu && i == 1;
            const Bound dst = to_up ? Bound{up, 0, size_t(rows) * up_n * 4} : window(p.y_col, p.n);
            MatmulArgs mm{K, p.n, rows, uint(rb), uint(a.in[0].ld), to_up ? up_n : y_ld};
            const std::string k = std::string("matmul_mm_") + type_suffix(w.type);
            dispatch(k.c_str(), &mm, sizeof mm, {Bound{w.buffer, w.offset, rb * p.n}, at(a.in[0], rows, K), dst},
                     MTLSizeMake((p.n + 63) / 64, (rows + 31) / 32, 1), MTLSizeMake(128, 1, 1),
                     {64 * 32 * 4, 32 * 32 * 4, 32 * 64 * 4});
            if (p.bias) {
                EwArgs e{p.n, y_ld, 0, y_ld, EW_ADD, 1.0f};  // b_ld 0: the bias row for every row
                dispatch("elementwise", &e, sizeof e, {dst, Bound{p.bias->buffer, p.bias->offset, p.n * 4}, dst},
                         MTLSizeMake((p.n + 255) / 256, rows, 1), MTLSizeMake(256, 1, 1));
            }
        }
        if (!swiglu) return;
    }
    const Bound g = window(0, parts[0].n), u{up, 0, size_t(rows) * up_n * 4};
    EwArgs e{up_n, y_ld, up_n, y_ld, EW_SWIGLU, 1.0f};
    dispatch("elementwise", &e, sizeof e, {g, u, g}, MTLSizeMake((up_n + 255) / 256, rows, 1), MTLSizeMake(256, 1, 1));
}

void MetalBackend::execute_node(const Node& node, const ExecArgs& a) {
    usable();
    const NodeMeta& m = node.meta;
    const uint rows = uint(node.rows), cols = uint(node.cols);
    auto in = [&](size_t i, int64_t c) { return at(a.in[i], node.rows, c); };
    const Bound out = at(a.out, node.rows, node.cols);
    const Bound err{err_, 0, 4};
    switch (node.op) {
        case Op::Input:
            return;
        case Op::GetRows: {
            const MetalWeight& w = weight(m.weight);
            GetRowsArgs g{uint(w.cols), uint(w.nbytes / size_t(w.rows)), uint(w.rows), uint(a.out.ld)};
            const std::string k = std::string("get_rows_") + type_suffix(w.type);
            return dispatch(k.c_str(), &g, sizeof g, {Bound{w.buffer, w.offset, w.nbytes}, in(0, 1), out, err},
                            MTLSizeMake((w.cols / 8 + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::PickRows: {  // each sequence's row: the gather of get_rows over f32 activations
            const BufRef& x = a.in[0];
            GetRowsArgs g{cols, uint(x.ld * 4), uint(x.rows), uint(a.out.ld)};
            return dispatch("get_rows_f32", &g, sizeof g, {at(x, x.rows, cols), in(1, 1), out, err},
                            MTLSizeMake((cols / 8 + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::TailRow: {
            EwArgs e{cols, uint(a.in[0].ld), uint(a.in[0].ld), uint(a.out.ld), EW_COPY, 1.0f};
            BufRef src = a.in[0];
            src.offset += int64_t(m.src_row) * src.ld;
            const Bound s = at(src, 1, cols);
            return dispatch("elementwise", &e, sizeof e, {s, s, out}, MTLSizeMake((cols + 255) / 256, 1, 1),
                            MTLSizeMake(256, 1, 1));
        }
        case Op::RmsNorm: case Op::QkNorm: {
            const uint width = node.op == Op::RmsNorm ? cols : uint(m.head_dim);
            const MetalWeight& w = weight(m.weight);
            NormArgs n{width, uint(a.in[0].ld), uint(a.out.ld), m.eps};
            const uint threads = norm_threads(width);
            return dispatch("rms_norm", &n, sizeof n, {in(0, cols), Bound{w.buffer, w.offset, width * 4}, out},
                            MTLSizeMake(rows, cols / width, 1), MTLSizeMake(threads, 1, 1), {threads / 32 * 4});
        }
        case Op::AddRmsNorm: {
            const uint width = cols / 2;
            const MetalWeight& w = weight(m.weight);
            AddNormArgs n{width, uint(a.in[0].ld), uint(a.in[1].ld), uint(a.out.ld), m.eps};
            const uint threads = norm_threads(width);
            return dispatch("add_rms_norm", &n, sizeof n,
                            {in(0, width), in(1, width), Bound{w.buffer, w.offset, width * 4}, out},
                            MTLSizeMake(rows, 1, 1), MTLSizeMake(threads, 1, 1), {threads / 32 * 4});
        }
        case Op::MatMul:
            return project(node, a, {part(m.weight, m.bias, cols, 0)}, false);
        case Op::FusedQKV: case Op::FusedQkvNorm: {
            const uint qc = uint(m.q_cols), kc = uint(m.k_cols);
            project(node, a, {part(m.wq, m.bq, qc, 0), part(m.wk, m.bk, kc, qc), part(m.wv, m.bv, uint(m.v_cols), qc + kc)},
                    false);
            if (node.op == Op::FusedQKV) return;
            for (int which = 0; which < 2; which++) {  // qwen3's per-head norms of q and k, in place
                const MetalWeight& w = weight(which ? m.k_norm : m.q_norm);
                const uint width = uint(m.head_dim), c0 = which ? qc : 0, n = which ? kc : qc;
                BufRef win = a.out;
                win.offset += c0;
                NormArgs na{width, uint(a.out.ld), uint(a.out.ld), m.eps};
                const uint threads = norm_threads(width);
                const Bound b = at(win, node.rows, n);
                dispatch("rms_norm", &na, sizeof na, {b, Bound{w.buffer, w.offset, width * 4}, b},
                         MTLSizeMake(rows, n / width, 1), MTLSizeMake(threads, 1, 1), {threads / 32 * 4});
            }
            return;
        }
        case Op::FusedFFN:
            return project(node, a, {part(m.w_gate, "", cols, 0), part(m.w_up, "", cols, 0)}, true);
        case Op::RopeKvStore: {
            const uint dim = uint(m.n_head_kv * m.head_dim);
            const bool paged = a.in.size() > 4;  // a batch step: each row's pool row, input 4
            RopeStoreArgs r{cols, dim, uint(m.head_dim), uint(m.rope_dim), m.rope_neox ? 1u : 0u, uint(a.in[0].ld),
                            uint(a.in[1].ld), uint(a.in[2].ld), uint(a.out.ld), uint(m.n_ctx), uint(m.kv_type),
                            uint(m.kv_ring), paged ? 1u : 0u};
            id<MTLBuffer> f = rope_freqs(m.rope_dim, m.rope_base, m.rope_scale);
            return dispatch("rope_kv_store", &r, sizeof r,
                            {in(0, cols), in(1, dim), in(2, dim), in(3, 1), Bound{f, 0, size_t(m.rope_dim / 2) * 4}, out,
                             whole(a.kv_k), whole(a.kv_v), err, in(paged ? 4 : 3, 1)},
                            MTLSizeMake(rows, 1, 1), MTLSizeMake(128, 1, 1), {dim * 4});
        }
        case Op::Rope: {
            RopeArgs r{cols, uint(m.head_dim), uint(m.rope_dim), uint(a.in[0].ld), uint(a.out.ld), m.rope_neox ? 1u : 0u};
            id<MTLBuffer> f = rope_freqs(m.rope_dim, m.rope_base, m.rope_scale);
            return dispatch("rope", &r, sizeof r, {in(0, cols), in(1, 1), Bound{f, 0, size_t(m.rope_dim / 2) * 4}, out},
                            MTLSizeMake((cols / 2 + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::KvStore: {
            const uint dim = uint(m.n_head_kv * m.head_dim);
            KvStoreArgs k{dim, uint(m.n_ctx), uint(a.in[0].ld), uint(a.in[1].ld), uint(m.kv_type), uint(m.kv_ring)};
            return dispatch("kv_store", &k, sizeof k, {in(0, dim), in(1, dim), in(2, 1), whole(a.kv_k), whole(a.kv_v), err},
                            MTLSizeMake((dim + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::Attn: {
            if (m.block_size > 0) {  // a batch step: rows of several sequences over the pool's blocks
                const uint bs = uint(m.block_size), max_blocks = uint(a.in[4].ld), n_seqs = uint(a.in[4].rows);
                PagedAttnArgs t{uint(m.n_head), uint(m.n_head_kv), uint(m.head_dim), uint(a.in[0].ld), uint(a.out.ld),
                                uint(m.kv_type), m.attn_scale, uint(m.window), bs, uint(m.n_ctx) / bs, max_blocks, n_seqs};
                return dispatch("attention_paged", &t, sizeof t,
                                {in(0, cols), in(1, 1), in(3, 1), at(a.in[4], n_seqs, max_blocks), whole(a.kv_k),
                                 whole(a.kv_v), out},
                                MTLSizeMake(uint(m.n_head), rows, 1), MTLSizeMake(128, 1, 1), {128 * 4, 4 * 4});
            }
            const uint S = (uint(m.n_ctx) + 511) / 512;  // one split per 512 cached positions (fixed by n_ctx)
            AttnArgs t{uint(m.n_head), uint(m.n_head_kv), uint(m.head_dim), uint(m.n_ctx), uint(a.in[0].ld),
                       uint(a.out.ld), uint(m.kv_type), m.attn_scale, S, rows, uint(m.window), uint(m.kv_ring)};
            const uint hd = uint(m.head_dim);
            if (rows >= 16 && m.kv_type == GGML_TYPE_F16 && hd % 8 == 0 && hd <= 128) {  // prefill on simdgroup matrices
                return dispatch("attention_prefill", &t, sizeof t,
                                {in(0, cols), in(1, 1), whole(a.kv_k), whole(a.kv_v), out},
                                MTLSizeMake(uint(m.n_head), (rows + 7) / 8, 1), MTLSizeMake(128, 1, 1),
                                {8 * hd * 4, 16 * hd * 4, 16 * hd * 4, 8 * 16 * 4, 8 * hd * 4, 3 * 8 * 4});
            }
            if (rows == 1 && S > 1 && attn_split_) {  // decode over a long cache: flash decoding
                const size_t floats = size_t(m.n_head) * S * size_t(m.head_dim + 2);
                if (!partial_ || [partial_ length] < floats * 4)
                    partial_ = [dev_.device newBufferWithLength:floats * 4 options:MTLResourceStorageModeShared];
                dispatch("attention_split", &t, sizeof t,
                         {in(0, cols), in(1, 1), whole(a.kv_k), whole(a.kv_v), Bound{partial_, 0, floats * 4}},
                         MTLSizeMake(uint(m.n_head), 1, S), MTLSizeMake(128, 1, 1), {128 * 4, 4 * 4});
                return dispatch("attention_combine", &t, sizeof t, {Bound{partial_, 0, floats * 4}, out},
                                MTLSizeMake(uint(m.n_head), 1, 1), MTLSizeMake(64, 1, 1));
            }
            return dispatch("attention", &t, sizeof t, {in(0, cols), in(1, 1), whole(a.kv_k), whole(a.kv_v), out},
                            MTLSizeMake(uint(m.n_head), rows, 1), MTLSizeMake(128, 1, 1), {128 * 4, 4 * 4});
        }
        case Op::Add: case Op::Mul: case Op::Silu: case Op::SwiGLU: case Op::Gelu: case Op::GeGLU: case Op::Scale:
        case Op::SoftCap: {
            const uint op = node.op == Op::Add ? EW_ADD : node.op == Op::Mul ? EW_MUL : node.op == Op::Silu ? EW_SILU
                          : node.op == Op::SwiGLU ? EW_SWIGLU : node.op == Op::Gelu ? EW_GELU
                          : node.op == Op::GeGLU ? EW_GEGLU : node.op == Op::Scale ? EW_SCALE : EW_SOFTCAP;
            const bool binary = node.op == Op::Add || node.op == Op::Mul || node.op == Op::SwiGLU || node.op == Op::GeGLU;
            EwArgs e{cols, uint(a.in[0].ld), binary ? uint(a.in[1].ld) : 0u, uint(a.out.ld), op, m.scale};
            const Bound b = binary ? in(1, cols) : in(0, cols);
            return dispatch("elementwise", &e, sizeof e, {in(0, cols), b, out}, MTLSizeMake((cols + 255) / 256, rows, 1),
                            MTLSizeMake(256, 1, 1));
        }
        default:
            throw MinferError(strfmt("Metal backend cannot execute node '%s' (op %s)", node.name.c_str(), op_name(node.op)));
    }
}

}  // namespace

MetalDeviceInfo metal_device_info() {
    MetalDeviceInfo info;
    info.built = true;
    MetalDevice& d = MetalDevice::get();
    info.available = d.error.empty();
    info.reason = d.error;
    if (d.device) info.name = ns([d.device name]);
    return info;
}

std::unique_ptr<Backend> make_metal_backend(const WeightStore* weights) { return std::make_unique<MetalBackend>(weights); }

}  // namespace minfer
