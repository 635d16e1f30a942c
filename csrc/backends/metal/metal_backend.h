// The Metal backend's host side, shared by its two files: the process-wide device state (MetalDevice), the
// backend's class (MetalBackend) and what its dispatches bind.  metal_backend.mm: the device, weights, buffers,
// dispatches and their bounded wait; metal_execute.mm: how each node is encoded (projections, norms, RoPE and
// the KV store, attention, elementwise ops).  Objective-C++: included by those two files only.
#pragma once
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

namespace minfer::metal_host {

inline std::string ns(NSString* s) { return s ? std::string([s UTF8String]) : std::string(); }

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

// The kernel name suffix of a weight type the kernels take, or nullptr.
const char* type_suffix(uint32_t t);

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

}  // namespace minfer::metal_host
