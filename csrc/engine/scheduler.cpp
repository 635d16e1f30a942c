#include "engine/scheduler.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_api.h"
#include "backends/metal/metal_api.h"
#include "backends/reference/reference_backend.h"
#include "common/error.h"
#include "common/settings.h"
#include "backends/kv_format.h"
#include "runtime/memory.h"

namespace minfer {

namespace {
Isa parse_isa(const std::string& s) {
    if (s.empty()) return default_isa();
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon})
        if (s == isa_name(isa)) return isa;
    throw MinferError(strfmt("unknown ISA '%s' (scalar, avx2, avx512, neon)", s.c_str()));
}
}  // namespace

std::shared_ptr<Model> Model::load(const std::string& path) {
    std::shared_ptr<Model> m(new Model());
    m->gguf_ = GGUF::open(path);
    m->weights_ = std::make_unique<WeightStore>(m->gguf_);
    m->config_ = ModelConfig::from_gguf(*m->weights_);
    return m;
}

namespace {
// Which device a request means: CUDA when asked for (an error if it cannot be had) or when "auto" finds one
// and every weight type has CUDA kernels (the gate); Metal likewise; else the CPU.  `say` prints why "auto"
// passed over a device that is there.
std::string resolve_device(std::string dev, const WeightStore& weights, bool say) {
    if (dev.empty()) dev = setting_text("MINFER_DEVICE");
    if (dev != "auto" && dev != "cpu" && dev != "cuda" && dev != "metal")
        throw MinferError(strfmt("device must be 'auto', 'cpu', 'cuda' or 'metal', got '%s'", dev.c_str()));
    if (dev == "metal" || dev == "auto") {
        MetalDeviceInfo info = metal_device_info();
        if (dev == "metal" && !info.available) throw MinferError("device='metal': " + info.reason);
        if (info.built && !info.available && dev == "auto" && say)
            std::fprintf(stderr, "minfer: Metal is not usable (%s); running without it\n", info.reason.c_str());
        if (info.available) return "metal";
    }
    if (dev == "cuda" || dev == "auto") {
        CudaDeviceInfo info = cuda_device_info();
        std::vector<std::string> missing = info.available ? cuda_unsupported_weights(weights) : std::vector<std::string>{};
        if (dev == "cuda" && !info.available) throw MinferError("device='cuda': " + info.reason);
        if (!missing.empty()) {
            std::string list;
            for (size_t i = 0; i < missing.size() && i < 4; i++) list += (i ? ", " : "") + missing[i];
            if (dev == "cuda")
                throw ModelError(strfmt("device='cuda': %zu weights have types without CUDA kernels: %s", missing.size(),
                                        list.c_str()));
            if (say)
                std::fprintf(stderr, "minfer: running on the CPU: %zu weights have types without CUDA kernels (%s)\n",
                             missing.size(), list.c_str());
        }
        if (info.available && missing.empty()) return "cuda";
    }
    return "cpu";
}
}  // namespace

size_t context_kv_bytes(const ModelConfig& c, uint32_t kv_type, int n_ctx) {
    const size_t kv_row = kv_row_bytes(kv_type, int64_t(c.n_head_kv) * c.head_dim);
    size_t bytes = 0;  // local layers keep rings (ModelConfig::kv_ring)
    for (int l = 0; l < c.n_layer; l++) {
        const int ring = c.kv_ring(l, n_ctx);
        bytes += 2 * kv_row * size_t(ring > 0 ? ring : n_ctx);
    }
    return bytes;
}

namespace {
int fitting_context(const Model& model, uint32_t kv_type, const std::string& device) {
    const ModelConfig& c = model.config();
    // The KV cache may take half of what is left: of the process's memory budget on the host (Metal's memory
    // is unified), of the device's free memory less the weights on CUDA.
    size_t room = SIZE_MAX;
    std::string where = "host memory";
    if (device == "cuda") {
        const size_t weights = model.weights().total_bytes();
        const CudaDeviceInfo info = cuda_device_info();
        room = info.free_bytes > weights ? (info.free_bytes - weights) / 2 : 0;
        where = "free device memory";
    } else {
        const MemoryBudget b = memory_budget();
        if (b.bytes != SIZE_MAX) room = b.bytes / 2, where = b.source;
    }
    const size_t full = context_kv_bytes(c, kv_type, c.n_ctx_train);
    if (full <= room) return c.n_ctx_train;
    int n = c.n_ctx_train / 256 * 256;  // the longest context in whole 256-token steps whose KV fits the room
    while (n > 256 && context_kv_bytes(c, kv_type, n) > room) n -= 256;
    n = std::max(n, std::min(c.n_ctx_train, 256));
    std::fprintf(stderr,
                 "minfer: context of %d tokens, not the model's %d: its %s KV cache would take %.1f GiB, and half "
                 "of the %s left is %.1f GiB (ask for n_ctx, or kv_type='q8_0')\n",
                 n, c.n_ctx_train, type_traits(kv_type).name, double(full) / (1 << 30), where.c_str(),
                 double(room) / (1 << 30));
    return n;
}

}  // namespace

int default_context(const Model& model, uint32_t kv_type, const std::string& device) {
    return fitting_context(model, kv_type, resolve_device(device, model.weights(), false));
}

Scheduler::Scheduler(std::shared_ptr<Model> model, SchedulerOptions opts) : model_(std::move(model)), opts_(std::move(opts)) {
    const ModelConfig& c = model_->config();
    if (opts_.n_ctx < 0) throw MinferError(strfmt("n_ctx must be positive, got %d", opts_.n_ctx));
    if (opts_.kv_type != 0 && opts_.kv_type != 1 && opts_.kv_type != 8)
        throw MinferError(strfmt("KV cache type %s is not supported (f32, f16, q8_0)", type_traits(opts_.kv_type).name));
    if (opts_.n_threads < 0) throw MinferError(strfmt("threads must be positive, got %d", opts_.n_threads));
    device_ = resolve_device(opts_.device, model_->weights(), true);
    const bool use_metal = device_ == "metal", use_cuda = device_ == "cuda";
    if (opts_.n_ctx == 0) opts_.n_ctx = fitting_context(*model_, opts_.kv_type, device_);
    if (opts_.n_ctx > c.n_ctx_train)
        throw MinferError(strfmt("n_ctx %d is larger than the model's context length %d", opts_.n_ctx, c.n_ctx_train));
    const size_t kv_bytes = context_kv_bytes(c, opts_.kv_type, opts_.n_ctx);
    const std::string kv_what =
        strfmt("the KV cache (%s, %d tokens x %d layers)", type_traits(opts_.kv_type).name, opts_.n_ctx, c.n_layer);
    // Refuse a KV cache that cannot fit now, not when the OOM killer notices
    // (on the GPU, the CUDA backend checks weights + KV against free device memory).
    if (!use_cuda) check_fits(kv_bytes, kv_what, "ask for a smaller n_ctx, or kv_type='q8_0'");  // Metal: unified memory
    pool_ = std::make_shared<ThreadPool>(opts_.n_threads ? opts_.n_threads : physical_cores());
    kv_.type = opts_.kv_type;
    kv_.n_ctx = opts_.n_ctx;

    // Backends in priority order (Metal, CUDA when used, then CPU); the reference
    // backend is always there for forced assignments ("only:reference", tests)
    // and never chosen on its own.
    if (use_metal) {
        backends_.push_back(make_metal_backend(&model_->weights()));
        slots_.push_back({backends_.back().get(), true, true});
    }
    if (use_cuda) {
        backends_.push_back(make_cuda_backend(&model_->weights(), kv_bytes));
        slots_.push_back({backends_.back().get(), true, true});
    }
    backends_.push_back(std::make_unique<CpuBackend>(&model_->weights(), pool_, parse_isa(opts_.isa)));
    slots_.push_back({backends_.back().get(), true, true});
    backends_.push_back(std::make_unique<ReferenceBackend>(&model_->weights()));
    slots_.push_back({backends_.back().get(), true, false});
    trace_ = setting_bool("MINFER_GRAPH_TRACE");
    profile_on_ = setting_bool("MINFER_OP_PROFILE");
    profile_ = std::make_unique<OpProfile>();
}

Scheduler::~Scheduler() {
    if (profile_on_) {
        std::fprintf(stderr, "minfer op profile (seconds, calls):\n");
        for (size_t i = 0; i < size_t(Op::Count); i++)
            if (profile_->calls[i])
                std::fprintf(stderr, "  %-13s %9.4f %8lld\n", op_name(Op(i)), profile_->seconds[i], (long long)profile_->calls[i]);
    }
}

std::vector<std::string> Scheduler::backend_names() const {
    std::vector<std::string> out;
    for (auto& b : backends_) out.push_back(b->name());
    return out;
}

std::unique_ptr<Plan> Scheduler::schedule(Graph graph, KvCache* kv, bool keep_all) {
    auto plan = std::make_unique<Plan>(std::move(graph), slots_, kv ? *kv : kv_, keep_all || opts_.keep_all);
    if (trace_) std::fprintf(stderr, "%s", plan->trace().c_str());
    return plan;
}

GraphParams Scheduler::step_params(int n_tokens, bool all_logits) const {
    GraphParams p;
    p.n_tokens = n_tokens;
    p.all_logits = all_logits && n_tokens > 1;
    p.fuse = opts_.fuse;
    p.kv_type = opts_.kv_type;
    p.n_ctx = opts_.n_ctx;
    p.assignment = opts_.assignment;
    return p;
}

void Scheduler::check_step(const int32_t* tokens, int n, int start_pos) const {
    const ModelConfig& c = model_->config();
    if (n <= 0) throw MinferError("eval: no tokens (an empty prompt)");
    if (start_pos < 0) throw MinferError(strfmt("eval: negative start position %d", start_pos));
    if (int64_t(start_pos) + n > opts_.n_ctx)
        throw MinferError(strfmt("eval: %d tokens at position %d exceed the context of %d tokens", n, start_pos, opts_.n_ctx));
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c.n_vocab)
            throw MinferError(strfmt("eval: token id %d at index %d is out of range [0, %d)", tokens[i], i, c.n_vocab));
}

void Scheduler::check_model_unchanged() const {
    // A weights file changed by another process is an error here, before any of its pages is read again
    // (see MappedFile::check_unchanged).
    for (const auto& f : model_->gguf().files()) f->check_unchanged();
}

void Scheduler::write_step(Plan& pl, const int32_t* tokens, int n, int start_pos) {
    check_step(tokens, n, start_pos);
    if (n != pl.graph().params.n_tokens)
        throw MinferError(strfmt("eval: %d tokens for a plan of %d", n, pl.graph().params.n_tokens));
    check_model_unchanged();
    std::vector<int32_t> pos((size_t)(n));
    for (int i = 0; i < n; i++) pos[size_t(i)] = start_pos + i;
    pl.write_input(InputKind::Tokens, tokens, n);
    pl.write_input(InputKind::Positions, pos.data(), n);
}

void Scheduler::run(Plan& pl, bool sync) { pl.execute(profile_on_ ? profile_.get() : nullptr, sync); }

void Scheduler::greedy_chain(Plan& pl, int token, int start_pos, int steps, int32_t* out) {
    if (steps <= 0) throw MinferError(strfmt("decode_greedy: %d steps (at least one)", steps));
    if (int64_t(start_pos) + steps > opts_.n_ctx)
        throw MinferError(strfmt("decode_greedy: %d steps from position %d exceed the context of %d tokens", steps,
                                 start_pos, opts_.n_ctx));
    write_step(pl, &token, 1, start_pos);  // validates token and position
    if (!profile_on_ && pl.greedy_chain(steps, out)) {
        chained_steps_ += steps;
        return;
    }
    for (int i = 0; i < steps; i++) {
        if (i) write_step(pl, &token, 1, start_pos + i);
        run(pl, false);
        out[i] = pl.argmax_last_row(pl.graph().output);
        token = out[i];
    }
}

}  // namespace minfer
