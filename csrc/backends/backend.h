// The Backend contract: what the graph machinery needs from one executor.
//
// Buffers are ids into the backend's own pool (f32 elements).  execute_node
// enqueues the node's work and may return before it is done; synchronize() is
// the only wait.  The output buffer may alias an input buffer (the allocator
// does this only for the ops listed in op_in_place_ok()).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace minfer {

// A window of a buffer: element (r, c) is at offset + r * ld + c, r < rows (the producer's rows).
struct BufRef {
    int id = -1;
    int64_t offset = 0;
    int64_t ld = 0;
    int64_t rows = 0;
};

struct ExecArgs {
    std::vector<BufRef> in;
    BufRef out;
    int kv_k = -1, kv_v = -1;  // the layer's persistent KV regions (KvStore, Attn)
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual const char* name() const = 0;
    virtual bool supports_op(const Node& node) const = 0;
    virtual bool supports_fused(Op fused) const = 0;
    virtual bool has_weight(const std::string& name) const = 0;

    virtual int alloc_buffer(size_t n_floats) = 0;  // may recycle a freed buffer of the same size
    virtual void free_buffer(int id) = 0;
    virtual int alloc_fresh(size_t n_floats) = 0;   // never a recycled one (split staging)
    virtual int alloc_kv(size_t bytes) = 0;         // persistent KV region, zero-filled
    virtual size_t buffer_size(int id) const = 0;   // in floats

    virtual void execute_node(const Node& node, const ExecArgs& args) = 0;
    virtual void read_host(int id, size_t offset, float* dst, size_t n) = 0;
    // Host memory of n floats that read_host fills fastest (CUDA: pinned, the copy lands there directly instead
    // of through a staging buffer), owned by the backend for its lifetime; one per backend, a later call for no
    // more returns the same; nullptr where plain memory is as fast.
    virtual float* host_buffer(size_t n_floats) { return nullptr; }
    virtual void write_host(int id, size_t offset, const float* src, size_t n) = 0;
    virtual void synchronize() = 0;
    // Index of the largest of n floats at (id, offset), the first on ties:
    // greedy decoding's only read-back.  allow: nullptr, or constrained decoding's bitmask of the indices that
    // may win (bit i of allow[i / 32]; the caller checks that one is set).  Default: read_host, then a scan.
    virtual int argmax(int id, size_t offset, size_t n, const uint32_t* allow = nullptr);
    // The argmax of each of `rows` rows of n floats, ld apart, from (id, offset), into out[0..rows): a batch
    // step's greedy tokens (allow: rows of ceil(n / 32) words, or nullptr).  Default: argmax row by row.
    virtual void argmax_rows(int id, size_t offset, size_t n, int rows, size_t ld, int32_t* out,
                             const uint32_t* allow = nullptr) {
        for (int r = 0; r < rows; r++)
            out[r] = argmax(id, offset + size_t(r) * ld, n, allow ? allow + size_t(r) * ((n + 31) / 32) : nullptr);
    }
    // The k best of each of `rows` rows of n floats, ld apart, from (id, offset): row r's values into
    // vals[r * k ..] and their indices into ids[r * k ..], ordered by value descending, then index ascending (the
    // sampler's top-k order, sampling/scan.h), 0 < k < n.  A NaN among the values is an error.  A sampled batch
    // step's read-back where each row's sampler needs only its top-k.  Default: read_host, then a scan a row.
    virtual void top_k_rows(int id, size_t offset, size_t n, int rows, size_t ld, int k, float* vals, int32_t* ids);
    // Whether greedy_chain_rows runs chains on this backend (the engine asks before it plans a chunk of steps).
    virtual bool chains() const { return false; }
    // The inputs a greedy chain advances (buffer ids; -1: the plan has none): every row is one sequence's token at
    // its position; a batch step's rows also find their KV slot through their row of the block tables
    // (max_blocks entries).
    struct ChainInputs {
        int token = -1, pos = -1, slot = -1, tables = -1;
        int block_size = 0, max_blocks = 0;
    };
    // Greedy decode chained on the device for `steps` steps (a single sequence's, or a batch's: one row a
    // sequence): after each step() the argmax of each of `rows` rows of n floats (ld apart) at (id, offset)
    // becomes that sequence's next token, its position advances by one and its slot follows its block table; row
    // r's winner of step i goes to out[i * rows + r]; the host waits once a bounded number of steps.  false: this
    // backend has no such chain (nothing was run; the caller loops).
    virtual bool greedy_chain_rows(int steps, const std::function<void()>& step, int id, size_t offset, size_t n,
                                   int rows, size_t ld, const ChainInputs& in, int32_t* out) {
        return false;
    }

    // Optional split capture (CUDA graphs).  The plan asks, per split and run:
    // replay_split(key) launches a recorded copy and returns true; otherwise
    // begin_capture(key) may start recording (true), the split's nodes are
    // executed, and end_capture(key, ok) turns the recording into a replayable
    // copy and launches it.  Keys are (plan id << 20 | split); forget_captures
    // drops a plan's recordings when the plan goes.
    virtual bool replay_split(uint64_t key) { return false; }
    virtual bool begin_capture(uint64_t key) { return false; }
    virtual void end_capture(uint64_t key, bool ok) {}
    virtual void forget_captures(uint64_t plan_id) {}
};

// Ops whose kernels are correct when the output buffer is one of the inputs.
bool op_in_place_ok(Op op);

}  // namespace minfer
