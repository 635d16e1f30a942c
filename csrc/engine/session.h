// A model in memory and a session over it.
//
// Model: the mmap'd GGUF, its weights by name and its hyperparameters.
// Session: the backends, the KV cache and the graph cache.  eval(tokens,
// start_pos) runs one step (a prompt or one decode token) and returns logits;
// a step with the same GraphParams as an earlier one reuses its plan.
#pragma once
#include <list>
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

struct SessionOptions {
    int n_ctx = 0;               // 0: the model's training context, capped at kDefaultCtxCap
    int n_threads = 0;           // 0: physical cores
    uint32_t kv_type = 1;        // F16; F32 and Q8_0 selectable
    std::string isa;             // "" = default_isa()
    std::string assignment;      // "", "alternate:K" (cpu/reference) or "only:NAME"
    std::string device;          // "auto" (CUDA when present), "cpu" or "cuda"; "" = $MINFER_DEVICE or auto
    bool fuse = true;
    bool keep_all = false;       // debugging: keep every node's output readable
    static constexpr int kDefaultCtxCap = 4096;
};

class Session {
  public:
    Session(std::shared_ptr<Model> model, SessionOptions opts);
    ~Session();

    // Runs tokens[0..n) at positions start_pos.. and writes logits into `out`:
    // [n, n_vocab] if all_logits, else [1, n_vocab] (the last position).
    void eval(const int32_t* tokens, int n, int start_pos, bool all_logits, float* out);
    // The same step, returning only the most likely next token (argmax of the
    // last position's logits, found on the device that computed them).
    int eval_greedy(const int32_t* tokens, int n, int start_pos);
    // `steps` greedy one-token steps from `token` at start_pos: out[i] is the token step i picks (and
    // step i + 1 consumes), what eval_greedy in a loop returns.  Where the step is one split on a backend
    // that can chain (CUDA), the token and position stay on the device and the host waits once per
    // up to 256 steps; elsewhere (and while profiling) it is that loop.
    void decode_greedy(int token, int start_pos, int steps, int32_t* out);

    // The plan for a step shape (built on first use, then cached).
    Plan& plan(int n_tokens, bool all_logits);
    // A plan for any graph over this model's weights (op tests); not cached, own KV cache.
    std::unique_ptr<Plan> plan_for(Graph graph, KvCache& kv);

    const Model& model() const { return *model_; }
    int n_ctx() const { return opts_.n_ctx; }
    int n_threads() const { return pool_->size(); }
    const SessionOptions& options() const { return opts_; }
    int graph_builds() const { return graph_builds_; }
    int64_t chained_steps() const { return chained_steps_; }  // decode_greedy steps run as a device chain
    const OpProfile& op_profile() const { return profile_; }
    std::vector<std::string> backend_names() const;
    const std::string& device() const { return device_; }  // what "auto" resolved to, and why not CUDA

  private:
    // Checks a step's tokens and positions and writes them to its plan's inputs; run_step also executes it.
    Plan& run_inputs(const int32_t* tokens, int n, int start_pos, bool all_logits);
    Plan& run_step(const int32_t* tokens, int n, int start_pos, bool all_logits, bool sync = true);
    std::shared_ptr<Model> model_;
    int64_t chained_steps_ = 0;
    SessionOptions opts_;
    std::shared_ptr<ThreadPool> pool_;
    std::vector<std::unique_ptr<Backend>> backends_;
    std::vector<BackendSlot> slots_;
    KvCache kv_;
    std::list<std::pair<GraphParams, std::unique_ptr<Plan>>> plans_;  // most recent first
    int graph_builds_ = 0;
    std::string device_;
    bool trace_ = false, profile_on_ = false;
    OpProfile profile_;
};

}  // namespace minfer
