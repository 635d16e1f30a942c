// The sampler, for the Python decode loop; sample_rows for a batch step (one sampler per sequence).
#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

#include "python/bindings.h"
#include "common/error.h"
#include "sampling/sampler.h"

namespace py = pybind11;

namespace minfer {

const uint32_t* allow_mask(const py::object& allow, int rows, int n_vocab) {
    if (allow.is_none()) return nullptr;
    if (!py::isinstance<py::array>(allow)) throw py::type_error("allow must be a numpy array of int32 or uint32 words");
    const py::array a = allow.cast<py::array>();
    const py::ssize_t words = (py::ssize_t(n_vocab) + 31) / 32;
    if (a.itemsize() != 4 || a.dtype().kind() == 'f')
        throw py::type_error("allow must be int32 or uint32 words (one bit a token)");
    if (!(a.flags() & py::array::c_style)) throw py::value_error("allow must be C-contiguous");
    const bool shape_ok = a.ndim() == 2 ? a.shape(0) == rows && a.shape(1) == words : a.ndim() == 1 && rows == 1 && a.shape(0) == words;
    if (!shape_ok)
        throw py::value_error(strfmt("allow must be [%d, %zu] words (%d rows of %d tokens)", rows, size_t(words), rows, n_vocab));
    return static_cast<const uint32_t*>(a.data());
}

Plan::AllowFn allow_fn(const py::object& allow, int rows, int n_vocab, py::object& hold) {
    if (allow.is_none()) return {};
    if (!PyCallable_Check(allow.ptr())) {
        hold = allow;
        const uint32_t* p = allow_mask(allow, rows, n_vocab);  // checked now, before the step
        return [p] { return p; };
    }
    return [&allow, &hold, rows, n_vocab]() -> const uint32_t* {
        py::gil_scoped_acquire gil;
        hold = allow();
        return allow_mask(hold, rows, n_vocab);
    };
}

void bind_sampling(py::module_& m) {
    py::class_<Distribution>(m, "Distribution", "candidate token ids and their probabilities (summing to 1)")
        .def_readonly("ids", &Distribution::ids)
        .def_readonly("probs", &Distribution::probs)
        .def_property_readonly("top_prob", [](const Distribution& d) {
            return d.probs.empty() ? 0.0 : *std::max_element(d.probs.begin(), d.probs.end());
        }, "the largest probability: how sure a sampled draft is");
    py::class_<Sampler>(m, "Sampler")
        .def(py::init([](int n_vocab, float temperature, int top_k, float top_p, float min_p, float repeat_penalty,
                         float presence_penalty, float frequency_penalty, int penalty_last_n, py::dict logit_bias,
                         uint64_t seed) {
                 SamplerParams p;
                 p.temperature = temperature;
                 p.top_k = top_k;
                 p.top_p = top_p;
                 p.min_p = min_p;
                 p.repeat_penalty = repeat_penalty;
                 p.presence_penalty = presence_penalty;
                 p.frequency_penalty = frequency_penalty;
                 p.penalty_last_n = penalty_last_n;
                 p.seed = seed;
                 for (auto item : logit_bias) p.logit_bias.push_back({item.first.cast<int>(), item.second.cast<float>()});
                 return std::make_unique<Sampler>(p, n_vocab);
             }),
             py::arg("n_vocab"), py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
             py::arg("min_p") = 0.0f, py::arg("repeat_penalty") = 1.0f, py::arg("presence_penalty") = 0.0f,
             py::arg("frequency_penalty") = 0.0f, py::arg("penalty_last_n") = 64, py::arg("logit_bias") = py::dict(),
             py::arg("seed") = 0)
        .def("sample", [](Sampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> logits,
                          const py::object& allow) {
            const int n = int(logits.size());
            return s.sample(logits.data(), n, allow_mask(allow, 1, n));
        }, py::arg("logits"), py::arg("allow") = py::none(),
           "the next token for a [n_vocab] logit vector; allow: the constraint's token bitmask (or None)")
        .def("sample_with_distribution", [](Sampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> logits,
                                            const py::object& allow) {
            Distribution q;
            const int n = int(logits.size());
            const int tok = s.sample(logits.data(), n, q, allow_mask(allow, 1, n));
            return py::make_tuple(tok, std::move(q));
        }, py::arg("logits"), py::arg("allow") = py::none(),
           "(token, the Distribution it was drawn from): a draft model's proposal")
        .def("verify", [](Sampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> logits, int draft,
                          const Distribution* q, const py::object& allow) {
            const int n = int(logits.size());
            return s.verify(logits.data(), n, draft, q, allow_mask(allow, 1, n));
        }, py::arg("logits"), py::arg("draft"), py::arg("q") = nullptr, py::arg("allow") = py::none(),
           "speculative sampling: `draft` if kept, else the token drawn in its place; q=None: the draft was "
           "proposed deterministically (prompt lookup)")
        .def_property_readonly("best_needed", &Sampler::best_needed,
             "how many of a row's best logits the token depends on: 1 greedy, top_k for a plain top-k chain, 0 the whole row")
        .def("sample_best", [](Sampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> vals,
                               py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids) {
            if (vals.ndim() != 1 || ids.ndim() != 1 || vals.size() != ids.size())
                throw py::value_error("sample_best: values and ids must be 1-D, of one length");
            return s.sample_best(vals.data(), ids.data(), int(vals.size()));
        }, py::arg("vals"), py::arg("ids"),
           "sample() from a row's k best logits (by value descending, then id) and their token ids: the same token")
        .def("accept", &Sampler::accept, py::arg("token"), "record a generated token (penalty window)")
        .def("reset", &Sampler::reset)
        .def_property_readonly("greedy", &Sampler::greedy,
                               "every token is the argmax of the logits as they are (no temperature, bias or penalty)");
    m.def("top_token", [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, double p_min) {
        const TopToken t = top_token(logits.data(), int(logits.size()), p_min);
        return py::make_tuple(t.id, t.prob);
    }, py::arg("logits"), py::arg("p_min") = 0.0,
       "(argmax, its softmax probability): how sure a greedy draft is; exact where >= p_min, else below p_min");
    m.def("sample_best_rows", [](const std::vector<Sampler*>& samplers,
                                 py::array_t<float, py::array::c_style | py::array::forcecast> vals,
                                 py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids) {
        // A few dozen candidates a row: one thread (a team's start costs more than the rows).
        const size_t n = samplers.size();
        if (vals.ndim() != 2 || ids.ndim() != 2 || size_t(vals.shape(0)) != n || ids.shape(0) != vals.shape(0) ||
            ids.shape(1) != vals.shape(1))
            throw py::value_error("sample_best_rows: values and ids must be [len(samplers), k] each");
        const int k = int(vals.shape(1));
        py::array_t<int32_t> out(py::ssize_t{py::ssize_t(n)});
        int32_t* o = out.mutable_data();
        for (size_t i = 0; i < n; i++) {
            if (!samplers[i]) throw py::value_error("sample_best_rows: a sampler is None");
            o[i] = samplers[i]->sample_best(vals.data() + i * size_t(k), ids.data() + i * size_t(k), k);
        }
        return out;
    }, py::arg("samplers"), py::arg("vals"), py::arg("ids"),
       "each row's next token by its own sampler from the row's k best logits and ids (BatchRunner.step_best)");
    m.def("sample_rows", [](const std::vector<Sampler*>& samplers,
                            py::array_t<float, py::array::c_style | py::array::forcecast> logits, const py::object& allow) {
        // Row i by samplers[i], the rows spread over threads (each sampler is its own state: the same tokens
        // as one call each, in any order).  A batch step's softmaxes over a whole vocabulary (~0.15 ms each at
        // 152k) otherwise run one after another between steps.
        if (logits.ndim() != 2 || size_t(logits.shape(0)) != samplers.size())
            throw py::value_error("sample_rows: logits must be [len(samplers), n_vocab]");
        for (const Sampler* s : samplers)
            if (!s) throw py::value_error("sample_rows: a sampler is None");
        const int n = int(samplers.size()), V = int(logits.shape(1));
        const uint32_t* mask = allow_mask(allow, n, V);  // row i's constraint (all bits set: none)
        const size_t words = size_t(V + 31) / 32;
        py::array_t<int32_t> out(py::ssize_t{n});
        int32_t* o = out.mutable_data();
        const float* x = logits.data();
        {
            py::gil_scoped_release nogil;
            const int T = std::max(1, std::min<int>(n, int(std::thread::hardware_concurrency())));
            std::vector<std::exception_ptr> err(static_cast<size_t>(T));
            auto work = [&](int t) {
                try {
                    for (int i = t; i < n; i += T) o[i] = samplers[size_t(i)]->sample(x + size_t(i) * size_t(V), V,
                                                                                     mask ? mask + size_t(i) * words : nullptr);
                } catch (...) {
                    err[size_t(t)] = std::current_exception();
                }
            };
            std::vector<std::thread> team;
            for (int t = 1; t < T; t++) team.emplace_back(work, t);
            work(0);
            for (auto& th : team) th.join();
            for (auto& e : err)
                if (e) std::rethrow_exception(e);
        }
        return out;
    }, py::arg("samplers"), py::arg("logits"), py::arg("allow") = py::none(),
       "each row's next token by its own sampler, rows in parallel; allow: [rows, words] token bitmasks or None");
}

}  // namespace minfer
