// An executable graph: backends assigned, fused, buffers allocated, splits
// found.  Built once per GraphParams and executed many times (every decode step
// reuses one plan; positions and tokens are inputs written before execute).
//
// Allocator: liveness over the node order; a buffer is recycled (same size, same
// backend) once its last reader has run; an in-place-safe op may take over its
// dead input's buffer; cross-backend inputs get fresh staging buffers on the
// consumer's backend, never recycled while the plan lives.  KV regions come
// from the session's KvCache.
//
// Scheduler: a split is a maximal run of nodes on one backend.  execute()
// walks the splits: at each backend change it synchronizes the previous
// backend and copies the split's inputs across, then executes every node of
// the split; one final synchronize per backend at the end, except for the last
// split's backend when the caller reads its result through that backend anyway
// (eval_greedy: the argmax is enqueued behind the step, one wait instead of two).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "graph/ir.h"
#include "graph/passes.h"
#include "runtime/kv_cache.h"

namespace minfer {

struct Split {
    int backend;
    int first, last;            // node range [first, last]
    std::vector<int> inputs;    // producers on other backends, copied in at the split's start
};

struct OpProfile {
    double seconds[size_t(Op::Count)] = {};
    int64_t calls[size_t(Op::Count)] = {};
};

class Plan {
  public:
    // keep_all: no buffer recycling, so every node's output can be read after execute (debugging).
    Plan(Graph graph, std::vector<BackendSlot> slots, KvCache& kv, bool keep_all = false);
    ~Plan();
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;

    void execute(OpProfile* profile = nullptr, bool sync_last = true);
    // A batch plan runs steps of fewer rows than it was built for: node i computes rows[i] rows, at most
    // the rows it was built (and allocated) with.  Captured splits are dropped when the rows change.
    void set_rows(const std::vector<int>& rows);
    void write_input(InputKind kind, const int32_t* values, int n);
    void write_node(int node, const float* values, size_t n);  // an Input node's buffer
    void poison();  // fill every non-input buffer with NaN (tests: unwritten outputs show)
    // The output of `node` after execute (only meaningful for live outputs, or with keep_all).
    std::vector<float> read_node(int node);
    void read_node(int node, float* out, size_t count);  // its first `count` values, straight into out
    // argmax over the last row of `node`'s output, computed where the node ran.
    // Constrained decoding: a function called once a step is launched (on a GPU, while it runs) that returns the
    // token bitmask its argmax keeps to, or nullptr for none.
    using AllowFn = std::function<const uint32_t*()>;
    // allow: nullptr, or constrained decoding's token bitmask (a row of ceil(cols / 32) words per output row;
    // MinferError where a row allows no token).
    int argmax_last_row(int node, const uint32_t* allow = nullptr);
    int argmax_row(int node, int row, const uint32_t* allow = nullptr);
    void argmax_rows(int node, int32_t* out, const uint32_t* allow = nullptr);  // every row's, where the node ran
    // The k best values and their indices (Backend::top_k_rows) of rows [first, first + rows) (rows < 0: every
    // row from first), where the node ran: rows x k each; 0 < k < the row's length, k <= kTopKMax (the most a
    // device's top-k kernel keeps).
    static constexpr int kTopKMax = 256;
    void top_k_rows(int node, int k, float* vals, int32_t* ids, int first = 0, int rows = -1);
    // Greedy decode of `steps` one-token steps chained on the backend (Backend::greedy_chain): the
    // token and position inputs must hold the first step's.  out[i] is step i's argmax of the output's
    // last row.  false, having run nothing: the plan is not one split on one backend with one token and
    // one position input, or that backend has no chain.
    bool greedy_chain(int steps, int32_t* out);
    // Whether greedy_chain would chain this plan's steps on its backend.
    bool chains() const;
    // A batch decode step's greedy chain (Backend::greedy_chain_rows): every row one sequence's token, the step's
    // inputs holding the first step's; step i's argmax of output row r goes to out[i * rows + r].  false, having
    // run nothing: the plan is not one split on one backend, has rows that are not one a sequence (a prompt
    // chunk, PickRows) or a sliding-window pool of its own, or that backend has no chain.
    bool greedy_chain_rows(int steps, int32_t* out);

    const Graph& graph() const { return graph_; }
    const std::vector<Split>& splits() const { return splits_; }
    int fusions() const { return fusions_; }
    std::string trace() const;  // split table and op x backend census

  private:
    Backend* backend(int i) const { return slots_[size_t(i)].backend; }
    void allocate(bool keep_all);
    void run_split(size_t s, OpProfile* profile);
    void find_splits();
    bool chain_inputs(int* tok, int* pos) const;  // the token and position inputs of a one-split, one-token plan

    Graph graph_;
    uint64_t id_;                                 // unique per plan: the key of its captured splits
    std::vector<BackendSlot> slots_;
    KvCache& kv_;
    int fusions_ = 0;
    std::vector<int> buf_;                        // node -> buffer id on its backend
    std::vector<int> built_rows_;                 // node -> the rows its buffer holds
    std::vector<ExecArgs> args_;                  // node -> resolved arguments
    std::vector<Split> splits_;
    std::map<std::pair<int, int>, int> staging_;  // (split, producer) -> buffer on the split's backend
    std::vector<std::pair<int, int>> owned_;      // (backend, buffer) to free with the plan
};

}  // namespace minfer
