// BatchRunner from Python: one step over many sequences of a paged KV pool (minfer.batch drives it).
#include <algorithm>
#include <cstring>

#include "engine/batch.h"
#include "python/bind_engine_util.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace minfer {

namespace {

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// The step's arrays, checked against each other before any work.
struct StepArgs {
    I32Array tokens, positions, seq_lens, tables, local;
    int n_seqs;
    const int32_t* local_tables() const { return local.size() ? local.data() : nullptr; }
};

StepArgs step_args(const BatchRunner& b, I32Array tokens, I32Array positions, I32Array seq_lens, I32Array tables,
                   const py::object& local_tables) {
    const py::ssize_t n = tokens.size(), s = seq_lens.size();
    if (tokens.ndim() != 1 || positions.ndim() != 1 || seq_lens.ndim() != 1)
        throw py::value_error("tokens, positions and seq_lens must be 1-D");
    if (positions.size() != n) throw py::value_error("tokens and positions differ in length");
    if (tables.ndim() != 2 || tables.shape(0) != s || tables.shape(1) != b.max_blocks())
        throw py::value_error("tables must be [len(seq_lens), max_blocks] = [" + std::to_string(s) + ", " +
                              std::to_string(b.max_blocks()) + "]");
    py::ssize_t total = 0;
    for (py::ssize_t i = 0; i < s; i++) total += seq_lens.data()[i];
    if (total != n) throw py::value_error("seq_lens add up to " + std::to_string(total) + ", not the " + std::to_string(n) + " tokens");
    I32Array local;
    if (!local_tables.is_none()) {
        local = local_tables.cast<I32Array>();
        if (local.ndim() != 2 || local.shape(0) != s || local.shape(1) != b.max_blocks())
            throw py::value_error("local_tables must be shaped as tables");
    }
    return {tokens, positions, seq_lens, tables, local, int(s)};
}

}  // namespace

void bind_batch(py::module_& m) {
    py::class_<BatchRunner>(m, "BatchRunner", "steps over many sequences sharing one paged KV pool")
        .def(py::init([](std::shared_ptr<Model> model, int n_ctx, int threads, const std::string& kv_type,
                         const std::string& device, int kv_tokens, int block_size, int local_tokens) {
                 return std::make_unique<BatchRunner>(std::move(model),
                                                      scheduler_options(n_ctx, threads, kv_type, "", device, true),
                                                      kv_tokens, block_size, local_tokens);
             }),
             py::arg("model"), py::arg("n_ctx") = 0, py::arg("threads") = 0, py::arg("kv_type") = "f16",
             py::arg("device") = "", py::arg("kv_tokens") = 0, py::arg("block_size") = 32, py::arg("local_tokens") = 0,
             "local_tokens > 0: the sliding-window layers get a pool of their own of that many tokens")
        .def("step", [](BatchRunner& b, I32Array tokens, I32Array positions, I32Array seq_lens, I32Array tables,
                        const py::object& local_tables, const py::object& out) {
            StepArgs a = step_args(b, tokens, positions, seq_lens, tables, local_tables);
            const int n_vocab = b.scheduler().model().config().n_vocab;
            py::array_t<float> logits;
            if (out.is_none()) {
                logits = py::array_t<float>({py::ssize_t(a.n_seqs), py::ssize_t(n_vocab)});
            } else {
                logits = py::array_t<float>::ensure(out);
                if (!logits || logits.ptr() != out.ptr() || logits.ndim() != 2 || logits.shape(1) != n_vocab ||
                    logits.shape(0) < a.n_seqs || !(logits.flags() & py::array::c_style) || !logits.writeable())
                    throw py::value_error("step: out must be a writable C-contiguous float32 array [>= " +
                                          std::to_string(a.n_seqs) + ", " + std::to_string(n_vocab) + "]");
            }
            float* o = logits.mutable_data();
            {
                py::gil_scoped_release nogil;
                b.step(a.tokens.data(), a.positions.data(), a.seq_lens.data(), a.n_seqs, a.tables.data(),
                       a.local_tables(), o);
            }
            return out.is_none() ? py::object(logits) : py::object(logits[py::slice(0, a.n_seqs, 1)]);
        }, py::arg("tokens"), py::arg("positions"), py::arg("seq_lens"), py::arg("tables"),
           py::arg("local_tables") = py::none(), py::arg("out") = py::none(),
           "one step: sequence s has seq_lens[s] consecutive rows; returns [n_seqs, n_vocab] logits of each "
           "sequence's last row (out: write them there, and return a view of its first rows)")
        .def("logits_buffer", [](py::object self, int rows) {
            BatchRunner& b = self.cast<BatchRunner&>();
            const py::ssize_t V = b.scheduler().model().config().n_vocab;
            float* p = b.logits_buffer(rows);
            return py::array_t<float>({py::ssize_t(rows), V}, {V * py::ssize_t(sizeof(float)), py::ssize_t(sizeof(float))},
                                      p, self);
        }, py::arg("rows"),
           "[rows, n_vocab] floats owned by the runner that step(out=...) fills fastest (pinned host memory on "
           "CUDA); each step overwrites it")
        .def("step_greedy", [](BatchRunner& b, I32Array tokens, I32Array positions, I32Array seq_lens, I32Array tables,
                               const py::object& local_tables, const py::object& allow) {
            StepArgs a = step_args(b, tokens, positions, seq_lens, tables, local_tables);
            py::array_t<int32_t> out(py::ssize_t{a.n_seqs});
            int32_t* o = out.mutable_data();
            py::object hold;
            const Plan::AllowFn fn = allow_fn(allow, a.n_seqs, b.scheduler().model().config().n_vocab, hold);
            {
                py::gil_scoped_release nogil;
                b.step_greedy(a.tokens.data(), a.positions.data(), a.seq_lens.data(), a.n_seqs, a.tables.data(),
                              a.local_tables(), o, fn);
            }
            return out;
        }, py::arg("tokens"), py::arg("positions"), py::arg("seq_lens"), py::arg("tables"),
           py::arg("local_tables") = py::none(), py::arg("allow") = py::none(),
           "the same step; returns each sequence's argmax token, among those its row of `allow` permits ([n_seqs, "
           "words] token bitmasks, or a callable returning them, called while the step runs)")
        .def("step_best", [](BatchRunner& b, I32Array tokens, I32Array positions, I32Array seq_lens, I32Array tables,
                             const py::object& local_tables, int k) {
            StepArgs a = step_args(b, tokens, positions, seq_lens, tables, local_tables);
            py::array_t<float> vals({py::ssize_t(a.n_seqs), py::ssize_t(k > 0 ? k : 0)});
            py::array_t<int32_t> ids({py::ssize_t(a.n_seqs), py::ssize_t(k > 0 ? k : 0)});
            float* v = vals.mutable_data();
            int32_t* t = ids.mutable_data();
            {
                py::gil_scoped_release nogil;
                b.step_best(a.tokens.data(), a.positions.data(), a.seq_lens.data(), a.n_seqs, a.tables.data(),
                            a.local_tables(), k, v, t);
            }
            return py::make_tuple(vals, ids);
        }, py::arg("tokens"), py::arg("positions"), py::arg("seq_lens"), py::arg("tables"),
           py::arg("local_tables") = py::none(), py::arg("k") = 40,
           "the same step; returns (values, ids), [n_seqs, k] each: each sequence's k best logits by value "
           "descending, then id, found where the logits were computed (0 < k < n_vocab)")
        .def("step_greedy_chain", [](BatchRunner& b, I32Array tokens, I32Array positions, I32Array tables, int steps,
                                     const py::object& local_tables) {
            const py::ssize_t n = tokens.size();
            I32Array ones(n);
            std::fill(ones.mutable_data(), ones.mutable_data() + n, 1);
            StepArgs a = step_args(b, tokens, positions, ones, tables, local_tables);
            py::array_t<int32_t> out({py::ssize_t(steps > 0 ? steps : 0), n});
            int32_t* o = out.mutable_data();
            {
                py::gil_scoped_release nogil;
                b.step_greedy_chain(a.tokens.data(), a.positions.data(), a.n_seqs, a.tables.data(), a.local_tables(),
                                    steps, o);
            }
            return out;
        }, py::arg("tokens"), py::arg("positions"), py::arg("tables"), py::arg("steps"),
           py::arg("local_tables") = py::none(),
           "`steps` greedy decode steps, one token a sequence (tokens at positions: the first step's), each step's "
           "argmax the next step's token; returns [steps, n_seqs] tokens.  The tables must hold the blocks of every "
           "position the chain writes.  On CUDA the steps follow each other on the device with one wait")
        .def_property_readonly("chains", [](BatchRunner& b) { return b.chains(); },
                               "whether step_greedy_chain runs its steps as a device chain (else one by one)")
        .def_property_readonly("chained_steps", &BatchRunner::chained_steps,
                               "steps step_greedy_chain has run as a device chain")
        .def("copy_block", &BatchRunner::copy_block, py::arg("src"), py::arg("dst"), py::arg("local") = false,
             "copies a block's KV rows in every layer of its pool (copy-on-write): local, the sliding-window layers' own")
        .def_property_readonly_static("best_max", [](py::object) { return BatchRunner::kBestMax; },
                                      "the most best logits a row step_best returns")
        .def("step_times", [](const BatchRunner& b) {
            const BatchRunner::StepTimes& t = b.step_times();
            py::dict d;
            d["prepare_s"] = t.prepare_s;
            d["launch_s"] = t.launch_s;
            d["read_s"] = t.read_s;
            d["steps"] = t.steps;
            return d;
        }, "the host's seconds in the steps so far, summed: prepare_s (checking the step, writing its inputs), "
           "launch_s (enqueuing it; on the CPU, running it), read_s (reading the result back; on a GPU, the "
           "wait), and the count of steps")
        .def_property_readonly("n_local_blocks", &BatchRunner::n_local_blocks)
        .def_property_readonly("n_blocks", &BatchRunner::n_blocks)
        .def_property_readonly("block_size", &BatchRunner::block_size)
        .def_property_readonly("max_blocks", &BatchRunner::max_blocks)
        .def_property_readonly("n_ctx", [](BatchRunner& b) { return b.scheduler().n_ctx(); })
        .def_property_readonly("n_vocab", [](BatchRunner& b) { return b.scheduler().model().config().n_vocab; })
        .def_property_readonly("device", [](BatchRunner& b) { return b.scheduler().device(); })
        .def_property_readonly("graph_builds", &BatchRunner::graph_builds)
        .def("prepare", [](BatchRunner& b, int max_seqs) {
            py::gil_scoped_release nogil;
            b.prepare(max_seqs);
        }, py::arg("max_seqs"), "builds the plans of steps of up to max_seqs sequences now")
        .def("placement", [](BatchRunner& b) {
            py::dict d;  // op -> sorted backend names
            for (const auto& [op, names] : b.placement()) d[py::str(op)] = std::vector<std::string>(names.begin(), names.end());
            return d;
        }, "which backends run each op of a step, a decode step's and a prompt step's: {op: [backend, ...]}")
        .def("op_profile", [](BatchRunner& b) {
            py::dict d;  // with MINFER_OP_PROFILE=1: seconds and calls per op so far
            const OpProfile& p = b.scheduler().op_profile();
            for (size_t i = 0; i < size_t(Op::Count); i++)
                if (p.calls[i]) d[op_name(Op(i))] = py::make_tuple(p.seconds[i], p.calls[i]);
            return d;
        });
}

}  // namespace minfer
