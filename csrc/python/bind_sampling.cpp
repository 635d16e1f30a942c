// The sampler, for the Python decode loop.
#include "python/bindings.h"
#include "sampling/sampler.h"

namespace py = pybind11;

namespace minfer {

void bind_sampling(py::module_& m) {
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
        .def("sample", [](Sampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> logits) {
            return s.sample(logits.data(), int(logits.size()));
        }, py::arg("logits"), "the next token for a [n_vocab] logit vector")
        .def("accept", &Sampler::accept, py::arg("token"), "record a generated token (penalty window)")
        .def("reset", &Sampler::reset)
        .def_property_readonly("greedy", &Sampler::greedy,
                               "every token is the argmax of the logits as they are (no temperature, bias or penalty)");
}

}  // namespace minfer
