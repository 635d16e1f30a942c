// A session: the convenience over a Scheduler for one sequence.  eval(tokens, start_pos) runs one step (a
// prompt or one decode token) of the model's graph and returns logits; a step with the same GraphParams as an
// earlier one reuses its plan (and, on CUDA, its captured graph).  Where the model's local layers keep their
// KV as rings (ModelConfig::kv_ring), a long step runs in pieces of kRingStep rows, and a step may start no
// further back than kRingStep positions before the furthest one written (or at 0: a new sequence); an earlier
// start is an error naming both.  Reference: tests/test_session.py, tests/test_kv_ring.py.
#pragma once
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"

namespace minfer {

using SessionOptions = SchedulerOptions;

class Session {
  public:
    Session(std::shared_ptr<Model> model, SessionOptions opts);
    ~Session();

    // Runs tokens[0..n) at positions start_pos.. and writes logits into `out`:
    // [n, n_vocab] if all_logits, else [1, n_vocab] (the last position).
    void eval(const int32_t* tokens, int n, int start_pos, bool all_logits, float* out);
    // The same step, returning only the most likely next token (argmax of the
    // last position's logits, found on the device that computed them), among the tokens `allow` permits.
    int eval_greedy(const int32_t* tokens, int n, int start_pos, const Plan::AllowFn& allow = {});
    // The same step; the last position's k best logits and their token ids (by logit descending, then id), found
    // where the logits are (only they are read back): what a top-k sampler needs (Sampler::best_needed).
    void eval_best(const int32_t* tokens, int n, int start_pos, int k, float* vals, int32_t* ids);
    // `steps` greedy one-token steps from `token` at start_pos (Scheduler::greedy_chain).
    void decode_greedy(int token, int start_pos, int steps, int32_t* out);

    // The plan for a step shape (built on first use, then cached).
    Plan& plan(int n_tokens, bool all_logits);
    // A plan for any graph over this model's weights (op tests); not cached, own KV cache.
    std::unique_ptr<Plan> plan_for(Graph graph, KvCache& kv);

    Scheduler& scheduler() { return sched_; }
    const Model& model() const { return sched_.model(); }
    int n_ctx() const { return sched_.n_ctx(); }
    int n_threads() const { return sched_.n_threads(); }
    const SessionOptions& options() const { return sched_.options(); }
    int graph_builds() const { return graph_builds_; }
    int64_t chained_steps() const { return sched_.chained_steps(); }
    const OpProfile& op_profile() const { return sched_.op_profile(); }
    std::vector<std::string> backend_names() const { return sched_.backend_names(); }
    const std::string& device() const { return sched_.device(); }
    // The earliest position a step may start at, other than 0 (0 where every layer keeps every position).
    int rewind_floor() const;
    // Bytes of the KV cache the steps so far have allocated (every layer's keys and values).
    size_t kv_bytes() const;

  private:
    Plan& run_step(const int32_t* tokens, int n, int start_pos, bool all_logits, bool sync = true);
    // A step whose last position alone is read (eval_greedy, eval_best): checked, run in pieces where the KV has
    // rings, the last piece enqueued without a wait (what reads its output waits for it).
    Plan& run_for_last(const int32_t* tokens, int n, int start_pos);
    bool rings() const;       // some layer's KV is a ring
    int max_step(int n) const { return rings() ? ModelConfig::kRingStep : n; }
    void check_rewind(int start_pos) const;
    void wrote(int start_pos, int n) { written_ = start_pos == 0 ? n : std::max(written_, start_pos + n); }
    Scheduler sched_;
    std::list<std::pair<GraphParams, std::unique_ptr<Plan>>> plans_;  // most recent first
    int graph_builds_ = 0;
    int written_ = 0;  // one past the furthest position written since the last step that started at 0
};

}  // namespace minfer
