// A batch step runner: many sequences per step over one paged KV pool.
//
// The pool is n_blocks blocks of block_size KV rows per layer; a sequence's KV lives in the blocks its table
// lists (Python's minfer.kv_blocks.BlockPool decides which).  step() runs one graph over every row of the
// step — a chunk of a prompt, or one decode token, per sequence, laid out sequence by sequence — so each
// weight is read once per step, and returns each sequence's last row's logits (or their argmax).  A plan is
// built for a power-of-two number of tokens and of sequences and runs any step that fits (Plan::set_rows),
// so a stream of steps of changing shapes reuses a handful of plans.
//
// A model with sliding-window layers may give them a pool of their own (local_tokens > 0): a row there reads
// only its window, so a sequence needs only its last window's blocks in that pool, and its table there
// (local_tables) lists those; entries before them are -1 (minfer.kv_blocks.WindowPool frees them as the
// sequence moves on).  Reference: tests/test_batch.py, tests/test_batch_window.py.
#pragma once
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"

namespace minfer {

class BatchRunner {
  public:
    // kv_tokens: the pool's size in tokens (rounded up to whole blocks); opts.n_ctx caps one sequence.
    // local_tokens: the sliding-window layers' own pool (0: they use the one pool; ignored without such layers).
    BatchRunner(std::shared_ptr<Model> model, SchedulerOptions opts, int kv_tokens, int block_size, int local_tokens = 0);
    ~BatchRunner();

    // One step over n_seqs sequences: sequence s contributes seq_lens[s] consecutive rows (tokens at
    // positions), and its block table is row s of tables ([n_seqs, max_blocks()]; entries past the
    // sequence's last block are ignored).  logits: [n_seqs, n_vocab], each sequence's last row.
    void step(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
              const int32_t* tables, const int32_t* local_tables, float* logits);
    // The same step; out[s] is the argmax of sequence s's logits, found where they were computed, among the
    // tokens row s of `allow`'s masks permits ([n_seqs] rows of ceil(n_vocab / 32) words).
    void step_greedy(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
                     const int32_t* tables, const int32_t* local_tables, int32_t* out, const Plan::AllowFn& allow = {});
    // The same step; each sequence's k best logits and their token ids ([n_seqs, k] each, by logit descending,
    // then id), found where the logits were computed: what a sampler whose chain needs only its top-k reads
    // (Sampler::best_needed), instead of the whole vocabulary's logits.  0 < k < n_vocab, k <= kBestMax.
    static constexpr int kBestMax = Plan::kTopKMax;
    // `steps` greedy decode steps of n_seqs sequences, one row each (tokens at positions, the first step's): each
    // step's argmax of a sequence's logits is its token in the next step, one position on.  out[i * n_seqs + s]:
    // sequence s's token of step i.  Every step's rows are checked first (the tables must already hold the
    // blocks of positions up to positions[s] + steps - 1).  Where the step is one split on a backend that
    // chains (CUDA) and has no sliding-window pool of its own, tokens, positions and KV slots advance on the
    // device and the host waits once; elsewhere (and while profiling) the host runs the steps one by one, with
    // the same result.
    void step_greedy_chain(const int32_t* tokens, const int32_t* positions, int n_seqs, const int32_t* tables,
                           const int32_t* local_tables, int steps, int32_t* out);
    // Whether step_greedy_chain chains a decode step's steps on the device.
    bool chains();
    int64_t chained_steps() const { return chained_steps_; }  // steps step_greedy_chain ran as a device chain
    void step_best(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
                   const int32_t* tables, const int32_t* local_tables, int k, float* vals, int32_t* ids);
    // Where step() writes logits fastest: [rows, n_vocab] floats the output's backend reads into directly (pinned
    // host memory on CUDA, where a fresh destination costs a staging copy and its page faults), kept for the
    // runner's lifetime; allocated at the first call, later calls for no more rows return it again.
    float* logits_buffer(int rows);
    // Builds now the plans that steps of up to max_seqs sequences take (a decode plan and a mixed one per power of
    // two), so that a server's memory is all taken at start rather than as rarer step shapes first come.
    void prepare(int max_seqs);
    // Which backends run each op of a step's graph (op name -> backend names), decode and prompt steps together.
    std::map<std::string, std::set<std::string>> placement();
    // Copies block src's KV rows to block dst in every layer of its pool (copy-on-write of a shared block):
    // the sliding-window layers' own pool where local, else the one pool.
    void copy_block(int src, int dst, bool local = false);

    int n_blocks() const { return n_blocks_; }
    int block_size() const { return block_size_; }
    int max_blocks() const { return max_blocks_; }  // blocks in one sequence's table: n_ctx / block_size
    int n_local_blocks() const { return n_local_blocks_; }  // the sliding-window layers' own pool (0: none)
    Scheduler& scheduler() { return sched_; }
    int graph_builds() const { return graph_builds_; }

    // Where the host's time in the steps went, summed over every step so far: checking the step and writing its
    // inputs, enqueuing it (on the CPU: running it), and reading its result back (on a GPU: the wait for the
    // device; a greedy step's masks are computed then).  A caller's wall time per step less these is its own.
    struct StepTimes {
        double prepare_s = 0.0, launch_s = 0.0, read_s = 0.0;
        int64_t steps = 0;
    };
    const StepTimes& step_times() const { return times_; }

  private:
    // A step's rows: their KV slots (and in the sliding-window pool), sequence indices and each sequence's last
    // row, every position and block checked (MinferError naming what is wrong).
    struct StepRows {
        int n = 0;
        std::vector<int32_t> slots, seq, out_rows, local_slots;
    };
    StepRows check_rows(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
                        const int32_t* tables, const int32_t* local_tables) const;
    // A step's rows checked and its inputs written (launch: then enqueued, sync: and waited for).
    Plan& run(const int32_t* tokens, const int32_t* positions, const int32_t* seq_lens, int n_seqs,
              const int32_t* tables, const int32_t* local_tables, bool sync, bool launch = true);
    Plan& plan(int n_tokens, int n_seqs);
    struct Cached {
        GraphParams params;
        std::unique_ptr<Plan> plan;
        std::vector<bool> per_seq;  // node -> its rows are one per sequence (else one per token)
    };
    Scheduler sched_;
    int block_size_, n_blocks_, max_blocks_, n_local_blocks_ = 0;
    KvCache kv_;
    std::list<Cached> plans_;  // most recent first
    // a decode step's plan is one split on a backend that chains, and no sliding-window pool of its own
    bool chains(const Plan& decode) const;
    int graph_builds_ = 0;
    int64_t chained_steps_ = 0;
    StepTimes times_;
    double step_t0_ = 0.0;  // the running step's read-back starts here (steady clock, seconds)
    void step_read_done();
    std::vector<float> logits_host_;  // logits_buffer() where the backend has no buffer of its own
    float* logits_buf_ = nullptr;
    int logits_rows_ = 0;
};

}  // namespace minfer
