// A model in memory, and the scheduler that runs graphs over it.
//
// Model: the mmap'd GGUF, its weights by name and its hyperparameters.
// Scheduler: the backends of one device choice (Metal or CUDA where used, the CPU, the float64 reference
// for forced assignments), their thread pool and the KV cache.  schedule(graph) assigns the graph's
// nodes to backends, fuses, allocates and finds the splits (a Plan); write_step and run feed a plan a
// step's tokens and positions and execute it.  The Session (session.h) and minfer.engine.greedy are
// built on it.  Reference: tests/test_engine.py.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "graph/plan.h"
#include "models/config.h"
#include "quant/quant.h"
#include "runtime/kv_cache.h"
#include "runtime/thread_pool.h"
#include "runtime/weights.h"

namespace minfer {

class Model {
  public:
    static std::shared_ptr<Model> load(const std::string& path);
    const ModelConfig& config() const { return config_; }
    const WeightStore& weights() const { return *weights_; }
    const GGUF& gguf() const { return *gguf_; }

  private:
    std::shared_ptr<GGUF> gguf_;
    std::unique_ptr<WeightStore> weights_;
    ModelConfig config_;
};

struct SchedulerOptions {
    int n_ctx = 0;               // 0: default_context
    int n_threads = 0;           // 0: physical cores
    uint32_t kv_type = 1;        // F16; F32 and Q8_0 selectable
    std::string isa;             // "" = default_isa()
    std::string assignment;      // "", "alternate:K" (cpu/reference) or "only:NAME"
    std::string device;          // "auto", "cpu", "cuda" or "metal"; "" = MINFER_DEVICE
    bool fuse = true;
    bool keep_all = false;       // debugging: keep every node's output readable
};

// The bytes of one sequence's KV cache of n_ctx positions (sliding-window layers keep rings).
size_t context_kv_bytes(const ModelConfig& c, uint32_t kv_type, int n_ctx);
// The context a session gets when it names none: the model's trained context, or the longest (in 256-token
// steps) whose KV takes at most half of the memory left where it lives (said on stderr when shorter).  `device`
// as SchedulerOptions::device.
int default_context(const Model& model, uint32_t kv_type, const std::string& device);

class Scheduler {
  public:
    Scheduler(std::shared_ptr<Model> model, SchedulerOptions opts);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Assignment, fusion, allocation and splits of `graph` over this scheduler's backends.  Its KV nodes use
    // `kv`, or the scheduler's own cache when kv is null.
    std::unique_ptr<Plan> schedule(Graph graph, KvCache* kv = nullptr, bool keep_all = false);
    // The GraphParams of a model step of n_tokens under this scheduler's options (ModelConfig::graph builds it).
    GraphParams step_params(int n_tokens, bool all_logits) const;
    // MinferError for a step that cannot run: no tokens, a bad position, past the context, a bad token id.
    void check_step(const int32_t* tokens, int n, int start_pos) const;
    // MinferError if a weights file changed on disk since it was mapped: a safe point before a step reads it.
    void check_model_unchanged() const;
    // Checks a step and writes its tokens and positions start_pos.. into the plan's inputs.
    void write_step(Plan& plan, const int32_t* tokens, int n, int start_pos);
    // Executes a plan (sync = false leaves the last split's backend running: the caller reads through it).
    void run(Plan& plan, bool sync = true);
    // `steps` greedy one-token steps of a one-token plan from `token` at start_pos: out[i] is the token step i
    // picks.  Where the plan is one split on a backend that can chain (CUDA), the token and position stay on
    // the device and the host waits once per up to 256 steps; elsewhere (and while profiling) a host loop.
    void greedy_chain(Plan& plan, int token, int start_pos, int steps, int32_t* out);

    const Model& model() const { return *model_; }
    std::shared_ptr<Model> model_ptr() const { return model_; }
    const SchedulerOptions& options() const { return opts_; }
    int n_ctx() const { return opts_.n_ctx; }
    int n_threads() const { return pool_->size(); }
    const std::vector<std::unique_ptr<Backend>>& backends() const { return backends_; }
    std::vector<std::string> backend_names() const;
    const std::string& device() const { return device_; }  // what "auto" resolved to
    const KvCache& kv() const { return kv_; }  // the session's cache (its regions once a plan has made them)
    int64_t chained_steps() const { return chained_steps_; }  // greedy_chain steps run as a device chain
    bool profiling() const { return profile_on_; }  // ops timed one by one: no captures, no chains
    const OpProfile& op_profile() const { return *profile_; }

  private:
    std::shared_ptr<Model> model_;
    SchedulerOptions opts_;
    std::shared_ptr<ThreadPool> pool_;
    std::vector<std::unique_ptr<Backend>> backends_;
    std::vector<BackendSlot> slots_;
    KvCache kv_;
    std::string device_;
    bool trace_ = false, profile_on_ = false;
    std::unique_ptr<OpProfile> profile_;
    int64_t chained_steps_ = 0;
};

}  // namespace minfer
