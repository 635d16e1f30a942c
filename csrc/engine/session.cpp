#include "engine/session.h"

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

Plan& Session::run_step(const int32_t* tokens, int n, int start_pos, bool all_logits, bool sync) {
    sched_.check_step(tokens, n, start_pos);  // before a plan is built for a bad step
    Plan& pl = plan(n, all_logits);
    sched_.write_step(pl, tokens, n, start_pos);
    sched_.run(pl, sync);
    return pl;
}

void Session::eval(const int32_t* tokens, int n, int start_pos, bool all_logits, float* out) {
    Plan& pl = run_step(tokens, n, start_pos, all_logits);
    const Node& o = pl.graph().nodes[size_t(pl.graph().output)];
    std::vector<float> logits = pl.read_node(pl.graph().output);
    std::memcpy(out, logits.data(), size_t(o.rows) * size_t(o.cols) * sizeof(float));
}

int Session::eval_greedy(const int32_t* tokens, int n, int start_pos, const Plan::AllowFn& allow) {
    // The argmax waits for the step itself: no synchronize between them (the output is the last split's).
    Plan& pl = run_step(tokens, n, start_pos, false, false);
    return pl.argmax_last_row(pl.graph().output, allow ? allow() : nullptr);
}

void Session::decode_greedy(int token, int start_pos, int steps, int32_t* out) {
    if (steps <= 0) throw MinferError(strfmt("decode_greedy: %d steps (at least one)", steps));
    sched_.check_step(&token, 1, start_pos);
    sched_.greedy_chain(plan(1, false), token, start_pos, steps, out);
}

}  // namespace minfer
