#include "engine/batch.h"

#include <algorithm>
#include <chrono>

#include "backends/kv_format.h"
#include "common/error.h"
#include "runtime/memory.h"

namespace minfer {

namespace {
constexpr size_t kMaxPlans = 24;  // power-of-two shapes: a decode and a mixed-step plan per sequence count
// Steps with prompt rows are planned for at least this many tokens (the engine's default step budget), so that
// all of them up to it share one plan per sequence count: a plan per power of two of their tokens too gave a
// long-running server new plans (and their memory) for hours, as rarer shapes came.
constexpr int kMixedTokens = 512;
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

BatchRunner::BatchRunner(std::shared_ptr<Model> model, SchedulerOptions opts, int kv_tokens, int block_size,
                         int local_tokens)
    : sched_(std::move(model), std::move(opts)), block_size_(block_size) {
    if (block_size < 1 || block_size > 1024 || (block_size & (block_size - 1)))
        throw MinferError(strfmt("block_size must be a power of two in [1, 1024], got %d", block_size));
    if (kv_tokens < 1) throw MinferError(strfmt("kv_tokens must be >= 1, got %d", kv_tokens));
    n_blocks_ = (kv_tokens + block_size - 1) / block_size;
    max_blocks_ = (sched_.n_ctx() + block_size - 1) / block_size;
    if (local_tokens < 0) throw MinferError(strfmt("local_tokens must be >= 0, got %d", local_tokens));
    const ModelConfig& c = sched_.model().config();
    int n_local_layers = 0;
    for (int l = 0; l < c.n_layer; l++) n_local_layers += c.is_local(l);
    if (n_local_layers > 0 && local_tokens > 0) n_local_blocks_ = (local_tokens + block_size - 1) / block_size;
    const size_t row = kv_row_bytes(sched_.options().kv_type, int64_t(c.n_head_kv) * c.head_dim);
    const size_t bytes = 2 * row * size_t(block_size) *
                         (size_t(c.n_layer - (n_local_blocks_ ? n_local_layers : 0)) * size_t(n_blocks_) +
                          size_t(n_local_blocks_ ? n_local_layers : 0) * size_t(n_local_blocks_));
    if (sched_.device() == "cpu")  // on a GPU the pool's allocation says when it does not fit
        check_fits(bytes, strfmt("the KV pool (%s, %d blocks of %d tokens x %d layers)", type_traits(sched_.options().kv_type).name,
                             n_blocks_, block_size, c.n_layer),
               "ask for fewer kv_tokens, or kv_type='q8_0'");
    kv_.type = sched_.options().kv_type;
    kv_.n_ctx = n_blocks_ * block_size;
    kv_.n_ctx_local = n_local_blocks_ * block_size;
}

BatchRunner::~BatchRunner() { plans_.clear(); }

Plan& BatchRunner::plan(int n_tokens, int n_seqs) {
    auto pow2 = [](int n) {
        int c = 1;
        while (c < n) c *= 2;
        return c;
    };
    // A decode step (one row per sequence) has no PickRows: its plan runs decode steps only.
    const bool decode = n_tokens == n_seqs;
    const int cap_seqs = pow2(n_seqs),
              cap_tokens = decode ? cap_seqs : std::max({pow2(n_tokens), cap_seqs + 1, kMixedTokens});
    GraphParams p = sched_.step_params(cap_tokens, false);
    p.n_seqs = cap_seqs;
    p.block_size = block_size_;
    p.max_blocks = max_blocks_;
    p.n_ctx = kv_.n_ctx;
    p.n_ctx_local = kv_.n_ctx_local;
    auto it = plans_.begin();
    while (it != plans_.end() && !(it->params == p)) ++it;
    if (it != plans_.end()) {
        plans_.splice(plans_.begin(), plans_, it);
    } else {
        if (plans_.size() >= kMaxPlans) plans_.pop_back();
        Cached c{p, sched_.schedule(sched_.model().config().graph(p), &kv_), {}};
        const Graph& g = c.plan->graph();
        for (const Node& n : g.nodes) {
            bool seq = false;
            if (n.op == Op::Input)
                seq = n.meta.input == InputKind::BlockTables || n.meta.input == InputKind::LocalTables ||
                      n.meta.input == InputKind::OutRows;
            else if (n.op == Op::PickRows) seq = true;
            else if (!n.in.empty()) seq = c.per_seq[size_t(n.in[0].node)];
            c.per_seq.push_back(seq);
        }
        plans_.push_front(std::move(c));
        graph_builds_++;
    }
    Cached& c = plans_.front();
    std::vector<int> rows(c.per_seq.size());
    for (size_t i = 0; i < rows.size(); i++) rows[i] = c.per_seq[i] ? n_seqs : n_tokens;
    c.plan->set_rows(rows);
    return *c.plan;
}

BatchRunner::StepRows BatchRunner::check_rows(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens,
                                              int n_seqs, const int32_t* tables, const int32_t* local_tables) const {
    const ModelConfig& c = sched_.model().config();
    if (n_seqs < 1) throw MinferError("batch step: no sequences");
    if (n_local_blocks_ > 0 && !local_tables)
        throw MinferError("batch step: the sliding-window layers have a pool of their own: give their block tables");
    int n = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (seq_lens[s] < 1) throw MinferError(strfmt("batch step: sequence %d has %d tokens (at least one)", s, seq_lens[s]));
        n += seq_lens[s];
    }
    StepRows out;
    out.n = n;
    out.slots.resize(size_t(n));
    out.seq.resize(size_t(n));
    out.out_rows.resize(size_t(n_seqs));
    if (n_local_blocks_ > 0) out.local_slots.resize(size_t(n));
    for (int s = 0, r = 0; s < n_seqs; s++) {
        const int32_t* table = tables + size_t(s) * size_t(max_blocks_);
        const int32_t* local = n_local_blocks_ ? local_tables + size_t(s) * size_t(max_blocks_) : nullptr;
        for (int i = 0; i < seq_lens[s]; i++, r++) {
            const int p = positions[r];
            if (tokens[r] < 0 || tokens[r] >= c.n_vocab)
                throw MinferError(strfmt("batch step: token id %d (sequence %d) is out of range [0, %d)", tokens[r], s, c.n_vocab));
            if (p < 0 || p >= sched_.n_ctx())
                throw MinferError(strfmt("batch step: position %d (sequence %d) is outside the context of %d tokens", p, s,
                                         sched_.n_ctx()));
            for (int b = 0; b <= p / block_size_; b++)  // every block the row's attention reads
                if (table[b] < 0 || table[b] >= n_blocks_)
                    throw MinferError(strfmt("batch step: sequence %d's block %d is %d, outside the pool of %d blocks", s, b,
                                             table[b], n_blocks_));
            out.slots[size_t(r)] = table[p / block_size_] * block_size_ + p % block_size_;
            if (local) {  // the blocks of the window the row reads
                for (int b = std::max(0, p - c.swa_window + 1) / block_size_; b <= p / block_size_; b++)
                    if (local[b] < 0 || local[b] >= n_local_blocks_)
                        throw MinferError(strfmt("batch step: sequence %d's block %d (position %d's window) in the "
                                                 "sliding-window pool is %d, outside its %d blocks",
                                                 s, b, p, local[b], n_local_blocks_));
                out.local_slots[size_t(r)] = local[p / block_size_] * block_size_ + p % block_size_;
            }
            out.seq[size_t(r)] = s;
        }
        out.out_rows[size_t(s)] = r - 1;
    }
    for (std::vector<int32_t> sorted : {out.slots, out.local_slots}) {  // two rows writing one KV row is a block-table
        std::sort(sorted.begin(), sorted.end());                  // bug (a shared block not copied): refuse it
        if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
            throw MinferError("batch step: two tokens of the step write the same KV row (a shared block needs a copy first)");
    }
    return out;
}

Plan& BatchRunner::run(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
                       const int32_t* tables, const int32_t* local_tables, bool sync, bool launch) {
    const double t0 = now_s();
    const StepRows rows = check_rows(tokens, positions, seq_lens, n_seqs, tables, local_tables);
    const int n = rows.n;
    sched_.check_model_unchanged();
    Plan& pl = plan(n, n_seqs);
    pl.write_input(InputKind::Tokens, tokens, n);
    pl.write_input(InputKind::Positions, positions, n);
    pl.write_input(InputKind::Slots, rows.slots.data(), n);
    pl.write_input(InputKind::SeqIndex, rows.seq.data(), n);
    pl.write_input(InputKind::BlockTables, tables, n_seqs * max_blocks_);
    if (n_local_blocks_ > 0) {
        pl.write_input(InputKind::LocalSlots, rows.local_slots.data(), n);
        pl.write_input(InputKind::LocalTables, local_tables, n_seqs * max_blocks_);
    }
    if (pl.graph().params.n_seqs < pl.graph().params.n_tokens) pl.write_input(InputKind::OutRows, rows.out_rows.data(), n_seqs);
    const double t1 = now_s();
    if (launch) sched_.run(pl, sync);
    step_t0_ = now_s();
    times_.prepare_s += t1 - t0;
    times_.launch_s += step_t0_ - t1;
    return pl;
}

void BatchRunner::step_read_done() {
    times_.read_s += now_s() - step_t0_;
    times_.steps++;
}

void BatchRunner::step(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
                       const int32_t* tables, const int32_t* local_tables, float* logits) {
    Plan& pl = run(tokens, positions, seq_lens, n_seqs, tables, local_tables, true);
    pl.read_node(pl.graph().output, logits, size_t(n_seqs) * size_t(sched_.model().config().n_vocab));
    step_read_done();
}

void BatchRunner::step_greedy(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
                              const int32_t* tables, const int32_t* local_tables, int32_t* out,
                              const Plan::AllowFn& allow) {
    Plan& pl = run(tokens, positions, seq_lens, n_seqs, tables, local_tables, false);
    pl.argmax_rows(pl.graph().output, out, allow ? allow() : nullptr);
    step_read_done();
}

void BatchRunner::step_best(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
                            const int32_t* tables, const int32_t* local_tables, int k, float* vals, int32_t* ids) {
    const int n_vocab = sched_.model().config().n_vocab;
    if (k < 1 || k >= n_vocab || k > kBestMax)
        throw MinferError(strfmt("step_best: k = %d (0 < k < %d, the vocabulary, and k <= %d)", k, n_vocab, kBestMax));
    Plan& pl = run(tokens, positions, seq_lens, n_seqs, tables, local_tables, false);
    pl.top_k_rows(pl.graph().output, k, vals, ids);
    step_read_done();
}

void BatchRunner::step_greedy_chain(const int32_t* tokens, const int32_t* positions, int n_seqs, const int32_t* tables,
                                    const int32_t* local_tables, int steps, int32_t* out) {
    if (steps < 1) throw MinferError(strfmt("greedy chain: %d steps (at least one)", steps));
    if (n_seqs < 1) throw MinferError("batch step: no sequences");
    const size_t n = size_t(n_seqs);
    std::vector<int32_t> ones(n, 1), pos(n);
    // every step's rows checked (positions, blocks, distinct KV rows) before the first runs (the tokens past the
    // first step's are argmaxes over the vocabulary)
    for (int i = 1; i < steps; i++) {
        for (size_t s = 0; s < n; s++) pos[s] = positions[s] + i;
        check_rows(tokens, pos.data(), ones.data(), n_seqs, tables, local_tables);
    }
    if (!sched_.profiling() && chains(plan(n_seqs, n_seqs))) {
        Plan& pl = run(tokens, positions, ones.data(), n_seqs, tables, local_tables, false, false);
        if (pl.greedy_chain_rows(steps, out)) {
            chained_steps_ += steps;
            times_.read_s += now_s() - step_t0_;
            times_.steps += steps;
            return;
        }
    }
    for (int i = 0; i < steps; i++) {  // one by one: each step's tokens the last one's argmax
        for (size_t s = 0; s < n; s++) pos[s] = positions[s] + i;
        Plan& pl = run(i ? out + size_t(i - 1) * n : tokens, pos.data(), ones.data(), n_seqs, tables, local_tables, false);
        pl.argmax_rows(pl.graph().output, out + size_t(i) * n);
        step_read_done();
    }
}

bool BatchRunner::chains(const Plan& decode) const {
    return n_local_blocks_ == 0 && decode.splits().size() == 1 &&
           sched_.backends()[size_t(decode.splits()[0].backend)]->chains();
}

bool BatchRunner::chains() { return chains(plan(1, 1)); }

float* BatchRunner::logits_buffer(int rows) {
    if (logits_buf_) {
        if (rows > logits_rows_)
            throw MinferError(strfmt("logits_buffer: it holds %d rows, %d asked", logits_rows_, rows));
        return logits_buf_;
    }
    if (rows < 1) throw MinferError(strfmt("logits_buffer: %d rows", rows));
    const size_t n = size_t(rows) * size_t(sched_.model().config().n_vocab);
    Plan& pl = plan(1, 1);  // the output's backend is every plan's
    logits_buf_ = sched_.backends()[size_t(pl.graph().nodes[size_t(pl.graph().output)].backend)]->host_buffer(n);
    if (!logits_buf_) {
        logits_host_.assign(n, 0.0f);
        logits_buf_ = logits_host_.data();
    }
    logits_rows_ = rows;
    return logits_buf_;
}

void BatchRunner::prepare(int max_seqs) {
    for (int s = 1; s < 2 * max_seqs; s *= 2) {
        plan(s, s);      // decode steps of up to s sequences
        plan(s + 1, s);  // steps with prompt rows (kMixedTokens or more)
    }
}

std::map<std::string, std::set<std::string>> BatchRunner::placement() {
    // a decode step's plan and one with a prompt row (its PickRows): the ops of every step, on their backends
    std::map<std::string, std::set<std::string>> out;
    for (int n_tokens : {1, 2})
        for (const Node& n : plan(n_tokens, 1).graph().nodes)
            if (n.op != Op::Input && n.backend >= 0) out[op_name(n.op)].insert(sched_.backends()[size_t(n.backend)]->name());
    return out;
}

void BatchRunner::copy_block(int src, int dst, bool local) {
    const int pool = local ? n_local_blocks_ : n_blocks_;
    if (src < 0 || src >= pool || dst < 0 || dst >= pool)
        throw MinferError(strfmt("copy_block: blocks %d -> %d outside the %spool of %d", src, dst,
                                 local ? "sliding-window layers' " : "", pool));
    const ModelConfig& c = sched_.model().config();
    const size_t bytes = size_t(block_size_) * kv_row_bytes(kv_.type, int64_t(c.n_head_kv) * c.head_dim);
    if (bytes % sizeof(float)) throw MinferError("copy_block: a block is not a whole number of floats");
    const size_t nf = bytes / sizeof(float);
    std::vector<float> tmp(nf);
    for (size_t l = 0; l < kv_.layers.size(); l++) {
        const KvRegion& r = kv_.layers[l];
        if (r.backend < 0) continue;  // no step has run yet
        if ((n_local_blocks_ > 0 && c.is_local(int(l))) != local) continue;  // the other pool
        Backend* b = sched_.backends()[size_t(r.backend)].get();
        for (int region : {r.k, r.v}) {
            b->read_host(region, size_t(src) * nf, tmp.data(), nf);
            b->write_host(region, size_t(dst) * nf, tmp.data(), nf);
        }
    }
}

}  // namespace minfer
