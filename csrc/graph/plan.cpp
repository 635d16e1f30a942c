#include "graph/plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <set>

#include "backends/kv_format.h"
#include "quant/types.h"
#include "common/error.h"
#include "sampling/scan.h"

namespace minfer {

namespace {
std::atomic<uint64_t> next_plan_id{1};
}

Plan::Plan(Graph graph, std::vector<BackendSlot> slots, KvCache& kv, bool keep_all)
    : graph_(std::move(graph)), id_(next_plan_id++), slots_(std::move(slots)), kv_(kv) {
    assign_backends(graph_, slots_, graph_.params.assignment);
    if (graph_.params.fuse) fusions_ = fuse(graph_, slots_);
    find_splits();
    allocate(keep_all);
    for (const Node& n : graph_.nodes) built_rows_.push_back(n.rows);
}

void Plan::set_rows(const std::vector<int>& rows) {
    if (rows.size() != graph_.nodes.size())
        throw MinferError(strfmt("set_rows: %zu row counts for %zu nodes", rows.size(), graph_.nodes.size()));
    bool changed = false;
    for (size_t i = 0; i < rows.size(); i++) {
        if (rows[i] < 1 || rows[i] > built_rows_[i])
            throw MinferError(strfmt("set_rows: node '%s' was built for %d rows, asked for %d", graph_.nodes[i].name.c_str(),
                                     built_rows_[i], rows[i]));
        changed |= graph_.nodes[i].rows != rows[i];
        graph_.nodes[i].rows = rows[i];
    }
    if (!changed) return;
    for (size_t i = 0; i < args_.size(); i++)
        for (size_t j = 0; j < graph_.nodes[i].in.size(); j++)
            args_[i].in[j].rows = graph_.nodes[size_t(graph_.nodes[i].in[j].node)].rows;
    for (const BackendSlot& slot : slots_) slot.backend->forget_captures(id_);
}

Plan::~Plan() {
    for (const BackendSlot& slot : slots_) slot.backend->forget_captures(id_);
    for (auto [b, id] : owned_) backend(b)->free_buffer(id);
}

void Plan::find_splits() {
    splits_.clear();
    for (int i = 0; i < int(graph_.nodes.size()); i++) {
        const Node& n = graph_.nodes[size_t(i)];
        if (splits_.empty() || splits_.back().backend != n.backend) splits_.push_back({n.backend, i, i, {}});
        Split& s = splits_.back();
        s.last = i;
        for (const NodeInput& in : n.in) {
            int p = in.node;
            if (graph_.nodes[size_t(p)].backend != s.backend &&
                std::find(s.inputs.begin(), s.inputs.end(), p) == s.inputs.end())
                s.inputs.push_back(p);
        }
    }
}

void Plan::allocate(bool keep_all) {
    const size_t N = graph_.nodes.size();
    std::vector<int> last_use(N, -1);
    for (size_t i = 0; i < N; i++)
        for (const NodeInput& in : graph_.nodes[i].in) last_use[size_t(in.node)] = int(i);
    last_use[size_t(graph_.output)] = INT_MAX;
    if (keep_all) std::fill(last_use.begin(), last_use.end(), INT_MAX);

    // plan-local free lists: (backend, size) -> ids
    std::map<std::pair<int, size_t>, std::vector<int>> free_list;
    auto size_of = [&](size_t i) { return size_t(std::max(1, graph_.nodes[i].rows * graph_.nodes[i].cols)); };
    auto take = [&](int b, size_t n) {
        auto& fl = free_list[{b, n}];
        if (!fl.empty()) {
            int id = fl.back();
            fl.pop_back();
            return id;
        }
        int id = backend(b)->alloc_buffer(n);
        owned_.push_back({b, id});
        return id;
    };

    buf_.assign(N, -1);
    for (size_t i = 0; i < N; i++) {
        const Node& n = graph_.nodes[i];
        // An in-place-safe op takes over an input that dies here (same backend, size, whole buffer).
        if (op_in_place_ok(n.op))
            for (const NodeInput& in : n.in) {
                size_t p = size_t(in.node);
                const Node& pn = graph_.nodes[p];
                if (pn.backend == n.backend && last_use[p] == int(i) && pn.op != Op::Input && in.col == 0 &&
                    (in.cols == -1 || in.cols == pn.cols) && size_of(p) == size_of(i) && pn.cols == n.cols) {
                    buf_[i] = buf_[p];
                    break;
                }
            }
        if (buf_[i] < 0) buf_[i] = take(n.backend, size_of(i));
        std::set<int> done;
        for (const NodeInput& in : n.in) {
            size_t p = size_t(in.node);
            if (last_use[p] == int(i) && buf_[p] != buf_[i] && done.insert(int(p)).second)
                free_list[{graph_.nodes[p].backend, size_of(p)}].push_back(buf_[p]);
        }
    }

    // Staging for cross-backend inputs: fresh, owned by the plan.
    for (size_t s = 0; s < splits_.size(); s++)
        for (int p : splits_[s].inputs) {
            int id = backend(splits_[s].backend)->alloc_fresh(size_of(size_t(p)));
            owned_.push_back({splits_[s].backend, id});
            staging_[{int(s), p}] = id;
        }

    // KV regions: created on first use, on the backend of the layer's KvStore.
    for (const Node& n : graph_.nodes) {
        if (!stores_kv(n.op)) continue;
        const int l = n.meta.layer;
        const int kv_rows = n.meta.window > 0 && kv_.n_ctx_local > 0 ? kv_.n_ctx_local : kv_.n_ctx;
        if (kv_.type != n.meta.kv_type || kv_rows != n.meta.n_ctx)
            throw MinferError(strfmt("graph KV (%s, %d positions) does not match the session's KV cache (%s, %d)",
                                     type_traits(n.meta.kv_type).name, n.meta.n_ctx, type_traits(kv_.type).name, kv_rows));
        if (size_t(l) >= kv_.layers.size()) kv_.layers.resize(size_t(l) + 1);
        KvRegion& r = kv_.layers[size_t(l)];
        if (r.backend < 0) {
            const int rows = n.meta.kv_ring > 0 ? n.meta.kv_ring : kv_rows;
            size_t bytes = kv_row_bytes(kv_.type, int64_t(n.meta.n_head_kv) * n.meta.head_dim) * size_t(rows);
            r = {n.backend, backend(n.backend)->alloc_kv(bytes), backend(n.backend)->alloc_kv(bytes), n.meta.kv_ring, bytes};
        } else if (r.backend != n.backend) {
            throw MinferError(strfmt("the KV cache of layer %d lives on %s but this graph runs it on %s", l,
                                     backend(r.backend)->name(), backend(n.backend)->name()));
        } else if (r.ring != n.meta.kv_ring) {
            throw MinferError(strfmt("the KV cache of layer %d is a ring of %d rows but this graph reads %d", l, r.ring,
                                     n.meta.kv_ring));
        }
    }

    // Resolved arguments per node.
    args_.assign(N, {});
    std::vector<int> split_of(N);
    for (size_t s = 0; s < splits_.size(); s++)
        for (int i = splits_[s].first; i <= splits_[s].last; i++) split_of[size_t(i)] = int(s);
    for (size_t i = 0; i < N; i++) {
        const Node& n = graph_.nodes[i];
        ExecArgs& a = args_[i];
        for (const NodeInput& in : n.in) {
            const Node& pn = graph_.nodes[size_t(in.node)];
            int id = pn.backend == n.backend ? buf_[size_t(in.node)] : staging_.at({split_of[i], in.node});
            a.in.push_back(BufRef{id, in.col, pn.cols, pn.rows});
        }
        a.out = BufRef{buf_[i], 0, n.cols};
        if (uses_kv(n.op)) {
            const KvRegion& r = kv_.layers.at(size_t(n.meta.layer));
            if (r.ring != n.meta.kv_ring)
                throw MinferError(strfmt("'%s' reads layer %d's KV cache as a ring of %d rows; it has %d", n.name.c_str(),
                                         n.meta.layer, n.meta.kv_ring, r.ring));
            a.kv_k = r.k;
            a.kv_v = r.v;
        }
    }
}

int Plan::argmax_last_row(int node, const uint32_t* allow) {
    return argmax_row(node, graph_.nodes.at(size_t(node)).rows - 1, allow);
}

namespace {
void check_allowed(const uint32_t* allow, int rows, int cols) {
    for (int r = 0; allow && r < rows; r++)
        if (!any_allowed(allow + size_t(r) * size_t((cols + 31) / 32), cols))
            throw MinferError(strfmt("argmax: the constraint of row %d allows no token", r));
}
}  // namespace

void Plan::argmax_rows(int node, int32_t* out, const uint32_t* allow) {
    const Node& n = graph_.nodes.at(size_t(node));
    check_allowed(allow, n.rows, n.cols);
    backend(n.backend)->argmax_rows(buf_[size_t(node)], 0, size_t(n.cols), n.rows, size_t(n.cols), out, allow);
}

void Plan::top_k_rows(int node, int k, float* vals, int32_t* ids, int first, int rows) {
    const Node& n = graph_.nodes.at(size_t(node));
    if (k < 1 || k >= n.cols || k > kTopKMax)
        throw MinferError(strfmt("top-k: k = %d for rows of %lld values (0 < k < n, k <= %d)", k, (long long)n.cols, kTopKMax));
    if (rows < 0) rows = n.rows - first;
    if (first < 0 || rows < 1 || first + rows > n.rows)
        throw MinferError(strfmt("top-k: rows [%d, %d) of %d", first, first + rows, n.rows));
    backend(n.backend)->top_k_rows(buf_[size_t(node)], size_t(first) * size_t(n.cols), size_t(n.cols), rows,
                                   size_t(n.cols), k, vals, ids);
}

int Plan::argmax_row(int node, int row, const uint32_t* allow) {
    const Node& n = graph_.nodes.at(size_t(node));
    if (row < 0 || row >= n.rows) throw MinferError(strfmt("argmax_row: row %d of %d", row, n.rows));
    check_allowed(allow, 1, n.cols);
    return backend(n.backend)->argmax(buf_[size_t(node)], size_t(row) * size_t(n.cols), size_t(n.cols), allow);
}

bool Plan::chain_inputs(int* tok, int* pos) const {
    if (splits_.size() != 1 || graph_.output < 0) return false;
    const int be = splits_[0].backend;
    *tok = *pos = -1;
    for (size_t i = 0; i < graph_.nodes.size(); i++) {
        const Node& n = graph_.nodes[i];
        if (n.op != Op::Input || n.meta.input == InputKind::Data) continue;
        if (n.meta.input != InputKind::Tokens && n.meta.input != InputKind::Positions) return false;  // a batch step
        int& slot = n.meta.input == InputKind::Tokens ? *tok : *pos;
        if (slot >= 0 || n.rows != 1 || n.backend != be) return false;
        slot = int(i);
    }
    return *tok >= 0 && *pos >= 0 && graph_.nodes[size_t(graph_.output)].backend == be;
}

bool Plan::chains() const {
    int tok, pos;
    return chain_inputs(&tok, &pos) && backend(splits_[0].backend)->chains();
}

bool Plan::greedy_chain(int steps, int32_t* out) {
    int tok, pos;
    if (!chain_inputs(&tok, &pos)) return false;
    const Node& o = graph_.nodes[size_t(graph_.output)];
    Backend::ChainInputs in;  // one row: the output's last
    in.token = buf_[size_t(tok)];
    in.pos = buf_[size_t(pos)];
    return backend(splits_[0].backend)->greedy_chain_rows(steps, [&] { run_split(0, nullptr); },
                                                          buf_[size_t(graph_.output)], size_t(o.rows - 1) * size_t(o.cols),
                                                          size_t(o.cols), 1, size_t(o.cols), in, out);
}

bool Plan::greedy_chain_rows(int steps, int32_t* out) {
    if (splits_.size() != 1 || graph_.output < 0) return false;
    const int be = splits_[0].backend;
    const Node& o = graph_.nodes[size_t(graph_.output)];
    Backend::ChainInputs in;
    in.block_size = graph_.params.block_size;
    in.max_blocks = graph_.params.max_blocks;
    for (size_t i = 0; i < graph_.nodes.size(); i++) {
        const Node& n = graph_.nodes[i];
        if (n.op == Op::PickRows) return false;  // a step with prompt rows
        if (n.op != Op::Input || n.meta.input == InputKind::Data) continue;
        if (n.backend != be) return false;
        const bool per_row = n.meta.input != InputKind::BlockTables;
        if (per_row && n.rows * n.cols != o.rows) return false;  // not a row a sequence
        int* slot = nullptr;
        switch (n.meta.input) {
            case InputKind::Tokens: slot = &in.token; break;
            case InputKind::Positions: slot = &in.pos; break;
            case InputKind::Slots: slot = &in.slot; break;
            case InputKind::BlockTables: slot = &in.tables; break;
            case InputKind::SeqIndex: continue;  // row r is sequence r throughout
            default: return false;  // OutRows: a step with prompt rows; a sliding-window pool's (the engine
                                    // chains none: its window blocks are given back as a sequence moves on)
        }
        if (*slot >= 0) return false;
        *slot = buf_[i];
    }
    if (in.token < 0 || in.pos < 0 || in.slot < 0 || in.tables < 0 || o.backend != be) return false;
    return backend(be)->greedy_chain_rows(steps, [&] { run_split(0, nullptr); }, buf_[size_t(graph_.output)], 0,
                                          size_t(o.cols), o.rows, size_t(o.cols), in, out);
}

void Plan::write_input(InputKind kind, const int32_t* values, int n) {
    for (size_t i = 0; i < graph_.nodes.size(); i++) {
        const Node& node = graph_.nodes[i];
        if (node.op != Op::Input || node.meta.input != kind) continue;
        if (n != node.rows * node.cols)
            throw MinferError(strfmt("input '%s' takes %d values, got %d", node.name.c_str(), node.rows * node.cols, n));
        backend(node.backend)->write_host(buf_[i], 0, (const float*)values, size_t(n));
    }
}

void Plan::write_node(int node, const float* values, size_t n) {
    const Node& nd = graph_.nodes.at(size_t(node));
    if (nd.op != Op::Input || n != size_t(std::max(1, nd.rows * nd.cols)))
        throw MinferError(strfmt("write_node: node '%s' is not an input of %d x %d values", nd.name.c_str(), nd.rows, nd.cols));
    backend(nd.backend)->write_host(buf_[size_t(node)], 0, values, n);
}

void Plan::poison() {
    for (size_t i = 0; i < graph_.nodes.size(); i++) {
        const Node& n = graph_.nodes[i];
        if (n.op == Op::Input) continue;
        std::vector<float> nan(backend(n.backend)->buffer_size(buf_[i]), __builtin_nanf(""));
        backend(n.backend)->write_host(buf_[i], 0, nan.data(), nan.size());
    }
}

std::vector<float> Plan::read_node(int node) {
    const Node& n = graph_.nodes.at(size_t(node));
    std::vector<float> out(size_t(std::max(1, n.rows * n.cols)));
    read_node(node, out.data(), out.size());
    return out;
}

void Plan::read_node(int node, float* out, size_t count) {
    const Node& n = graph_.nodes.at(size_t(node));
    if (count > size_t(std::max(1, n.rows * n.cols)))
        throw MinferError(strfmt("read_node: %zu values of a node of %d x %d", count, n.rows, n.cols));
    backend(n.backend)->read_host(buf_[size_t(node)], 0, out, count);
}

void Plan::execute(OpProfile* profile, bool sync_last) {
    int prev = -1;
    std::vector<float> tmp;
    std::set<int> used;
    for (size_t s = 0; s < splits_.size(); s++) {
        const Split& sp = splits_[s];
        Backend* be = backend(sp.backend);
        if (prev >= 0 && prev != sp.backend) backend(prev)->synchronize();
        for (int p : sp.inputs) {  // copy across through the host
            const Node& pn = graph_.nodes[size_t(p)];
            tmp.resize(size_t(std::max(1, pn.rows * pn.cols)));
            backend(pn.backend)->read_host(buf_[size_t(p)], 0, tmp.data(), tmp.size());
            be->write_host(staging_.at({int(s), p}), 0, tmp.data(), tmp.size());
        }
        run_split(s, profile);
        used.insert(sp.backend);
        prev = sp.backend;
    }
    // Unsynchronized, the last split's backend must be the one the caller reads the output from.
    const bool keep = !sync_last && graph_.output >= 0 && graph_.nodes[size_t(graph_.output)].backend == prev;
    for (int b : used)
        if (!keep || b != prev) backend(b)->synchronize();
}

// One split's nodes, or a replay of its captured launches where the backend
// keeps them (profiling always runs node by node, synchronizing after each).
void Plan::run_split(size_t s, OpProfile* profile) {
    const Split& sp = splits_[s];
    Backend* be = backend(sp.backend);
    const uint64_t key = id_ << 20 | uint64_t(s);
    if (!profile && be->replay_split(key)) return;
    const bool capturing = !profile && be->begin_capture(key);
    try {
        for (int i = sp.first; i <= sp.last; i++) {
            const Node& n = graph_.nodes[size_t(i)];
            if (n.backend != sp.backend)
                throw MinferError(strfmt("node '%s' is assigned to %s but sits in a %s split", n.name.c_str(),
                                         backend(n.backend)->name(), be->name()));
            if (profile) {
                auto t0 = std::chrono::steady_clock::now();
                be->execute_node(n, args_[size_t(i)]);
                be->synchronize();
                profile->seconds[size_t(n.op)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                profile->calls[size_t(n.op)]++;
            } else {
                be->execute_node(n, args_[size_t(i)]);
            }
        }
    } catch (...) {
        if (capturing) be->end_capture(key, false);
        throw;
    }
    if (capturing) be->end_capture(key, true);
}

std::string Plan::trace() const {
    std::string out = strfmt("graph: %zu nodes, %zu splits, %d fusions (n_tokens=%d)\n", graph_.nodes.size(),
                             splits_.size(), fusions_, graph_.params.n_tokens);
    for (size_t s = 0; s < splits_.size(); s++) {
        const Split& sp = splits_[s];
        out += strfmt("  split %zu: %-9s nodes %d..%d (%s .. %s), %zu inputs copied in\n", s, backend(sp.backend)->name(),
                      sp.first, sp.last, graph_.nodes[size_t(sp.first)].name.c_str(),
                      graph_.nodes[size_t(sp.last)].name.c_str(), sp.inputs.size());
    }
    std::map<std::pair<std::string, std::string>, int> census;
    for (const Node& n : graph_.nodes) census[{op_name(n.op), backend(n.backend)->name()}]++;
    out += "  op x backend:\n";
    for (auto& [k, c] : census) out += strfmt("    %-13s %-9s %d\n", k.first.c_str(), k.second.c_str(), c);
    return out;
}

}  // namespace minfer
