#include "engine/session.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace minfer {

namespace {
constexpr size_t kMaxPlans = 4;  // a prompt plan, the decode plan, and a couple of others
}  // namespace

Session::Session(std::shared_ptr<Model> model, SessionOptions opts) : sched_(std::move(model), std::move(opts)) {}

Session::~Session() { plans_.clear(); }

Plan& Session::plan(int n_tokens, bool all_logits) {
    const GraphParams p = sched_.step_params(n_tokens, all_logits);
    for (auto it = plans_.begin(); it != plans_.end(); ++it)
        if (it->first == p) {
            plans_.splice(plans_.begin(), plans_, it);  // most recently used first
            return *plans_.front().second;
        }
    if (plans_.size() >= kMaxPlans) plans_.pop_back();
    plans_.emplace_front(p, sched_.schedule(sched_.model().config().graph(p)));
    graph_builds_++;
    return *plans_.front().second;
}

std::unique_ptr<Plan> Session::plan_for(Graph graph, KvCache& kv) { return sched_.schedule(std::move(graph), &kv, true); }

bool Session::rings() const {
    const ModelConfig& c = model().config();
    for (int l = 0; l < c.n_layer; l++)
        if (c.kv_ring(l, n_ctx()) > 0) return true;
    return false;
}

int Session::rewind_floor() const { return rings() ? std::max(0, written_ - ModelConfig::kRingStep) : 0; }

size_t Session::kv_bytes() const {
    size_t total = 0;
    for (const KvRegion& r : sched_.kv().layers) total += 2 * r.bytes;
    return total;
}

void Session::check_rewind(int start_pos) const {
    if (start_pos > 0 && start_pos < rewind_floor())
        throw MinferError(strfmt("eval at position %d: this model's local layers keep their last %d positions in a "
                                 "ring, and position %d has been written, so a step may start at 0 or at %d or later",
                                 start_pos, ModelConfig::kRingStep, written_ - 1, rewind_floor()));
}

Plan& Session::run_step(const int32_t* tokens, int n, int start_pos, bool all_logits, bool sync) {
    sched_.check_step(tokens, n, start_pos);  // before a plan is built for a bad step
    check_rewind(start_pos);
    if (n > max_step(n)) throw MinferError(strfmt("a step of %d rows: a KV ring takes %d at most", n, max_step(n)));
    Plan& pl = plan(n, all_logits);
    sched_.write_step(pl, tokens, n, start_pos);
    sched_.run(pl, sync);
    wrote(start_pos, n);
    return pl;
}

void Session::eval(const int32_t* tokens, int n, int start_pos, bool all_logits, float* out) {
    sched_.check_step(tokens, n, start_pos);
    check_rewind(start_pos);
    const int step = max_step(n);
    for (int i = 0; i < n; i += step) {  // pieces of a long step where the KV has rings
        const int m = std::min(step, n - i);
        Plan& pl = run_step(tokens + i, m, start_pos + i, all_logits);
        if (!all_logits && i + m < n) continue;
        const Node& o = pl.graph().nodes[size_t(pl.graph().output)];
        std::vector<float> logits = pl.read_node(pl.graph().output);
        std::memcpy(out + (all_logits ? size_t(i) * size_t(o.cols) : 0), logits.data(),
                    size_t(o.rows) * size_t(o.cols) * sizeof(float));
    }
}

Plan& Session::run_for_last(const int32_t* tokens, int n, int start_pos) {
    sched_.check_step(tokens, n, start_pos);
    check_rewind(start_pos);
    const int step = max_step(n);
    int i = 0;
    for (; n - i > step; i += step) run_step(tokens + i, step, start_pos + i, false);
    // The read of the output waits for the step itself: no synchronize between them (the output is the last split's).
    return run_step(tokens + i, n - i, start_pos + i, false, false);
}

int Session::eval_greedy(const int32_t* tokens, int n, int start_pos, const Plan::AllowFn& allow) {
    Plan& pl = run_for_last(tokens, n, start_pos);
    return pl.argmax_last_row(pl.graph().output, allow ? allow() : nullptr);
}

void Session::eval_best(const int32_t* tokens, int n, int start_pos, int k, float* vals, int32_t* ids) {
    Plan& pl = run_for_last(tokens, n, start_pos);
    pl.top_k_rows(pl.graph().output, k, vals, ids, pl.graph().nodes[size_t(pl.graph().output)].rows - 1, 1);
}

void Session::decode_greedy(int token, int start_pos, int steps, int32_t* out) {
    if (steps <= 0) throw MinferError(strfmt("decode_greedy: %d steps (at least one)", steps));
    sched_.check_step(&token, 1, start_pos);
    check_rewind(start_pos);
    sched_.greedy_chain(plan(1, false), token, start_pos, steps, out);
    wrote(start_pos, steps);
}

}  // namespace minfer
