// Engine bindings: Model, Session and Plan, so the decode loop in python/minfer
// is written against the engine's own objects and a user can build a plan,
// inspect its nodes and splits, run it and read any node's output.
#include <cstring>

#include "common/error.h"
#include "python/bindings.h"
#include "runtime/session.h"

namespace py = pybind11;

namespace minfer {

namespace {

uint32_t kv_type_from(const std::string& s) {
    if (s == "f16") return GGML_TYPE_F16;
    if (s == "f32") return GGML_TYPE_F32;
    if (s == "q8_0") return GGML_TYPE_Q8_0;
    throw py::value_error("kv_type must be 'f16', 'f32' or 'q8_0', got '" + s + "'");
}

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

py::dict node_dict(const Plan& p, const Node& n) {
    py::dict d;
    d["name"] = n.name;
    d["op"] = op_name(n.op);
    d["backend"] = n.backend;
    d["rows"] = n.rows;
    d["cols"] = n.cols;
    py::list ins;
    for (const NodeInput& in : n.in) ins.append(py::make_tuple(in.node, in.col, in.cols));
    d["inputs"] = ins;
    d["layer"] = n.meta.layer;
    py::list ws;
    for (const std::string& w : Graph::weights_of(n)) ws.append(w);
    d["weights"] = ws;
    return d;
}

}  // namespace

void bind_engine(py::module_& m) {
    py::class_<Model, std::shared_ptr<Model>>(m, "Model")
        .def(py::init([](const std::string& path) { return Model::load(path); }), py::arg("path"))
        .def_property_readonly("config", [](const Model& mdl) {
            const ModelConfig& c = mdl.config();
            py::dict d;
            d["arch"] = c.arch;
            d["n_layer"] = c.n_layer;
            d["n_embd"] = c.n_embd;
            d["n_ff"] = c.n_ff;
            d["n_head"] = c.n_head;
            d["n_head_kv"] = c.n_head_kv;
            d["head_dim"] = c.head_dim;
            d["n_vocab"] = c.n_vocab;
            d["n_ctx_train"] = c.n_ctx_train;
            d["eps"] = c.eps;
            d["rope_base"] = c.rope_base;
            d["rope_dim"] = c.rope_dim;
            d["rope_neox"] = c.rope_neox;
            d["output_weight"] = c.output_weight;
            return d;
        })
        .def_property_readonly("weight_bytes", [](const Model& mdl) {
            size_t total = 0;
            for (auto& [name, w] : mdl.weights().all()) total += w.nbytes;
            return total;
        });

    py::class_<Plan>(m, "Plan")
        .def_property_readonly("nodes", [](const Plan& p) {
            py::list out;
            for (const Node& n : p.graph().nodes) out.append(node_dict(p, n));
            return out;
        })
        .def_property_readonly("splits", [](const Plan& p) {
            py::list out;
            for (const Split& s : p.splits()) {
                py::dict d;
                d["backend"] = s.backend;
                d["first"] = s.first;
                d["last"] = s.last;
                d["inputs"] = s.inputs;
                out.append(d);
            }
            return out;
        })
        .def_property_readonly("output", [](const Plan& p) { return p.graph().output; })
        .def_property_readonly("fusions", &Plan::fusions)
        .def_property_readonly("n_tokens", [](const Plan& p) { return p.graph().params.n_tokens; })
        .def("trace", &Plan::trace)
        .def("read", [](Plan& p, int node) {
            if (node < 0 || size_t(node) >= p.graph().nodes.size()) throw py::index_error("no such node");
            const Node& n = p.graph().nodes[size_t(node)];
            std::vector<float> v = p.read_node(node);
            py::array_t<float> a({py::ssize_t(n.rows), py::ssize_t(std::max(1, n.cols))});
            std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(float));
            return a;
        }, py::arg("node"), "a node's output after the last run (dead nodes' buffers are recycled unless keep_all)");

    py::class_<Session>(m, "Session")
        .def(py::init([](std::shared_ptr<Model> model, int n_ctx, int threads, const std::string& kv_type,
                         const std::string& isa, const std::string& assignment, bool fuse, bool keep_all) {
                 SessionOptions o;
                 o.n_ctx = n_ctx;
                 o.n_threads = threads;
                 o.kv_type = kv_type_from(kv_type);
                 o.isa = isa;
                 o.assignment = assignment;
                 o.fuse = fuse;
                 o.keep_all = keep_all;
                 return std::make_unique<Session>(std::move(model), o);
             }),
             py::arg("model"), py::arg("n_ctx") = 0, py::arg("threads") = 0, py::arg("kv_type") = "f16",
             py::arg("isa") = "", py::arg("assignment") = "", py::arg("fuse") = true, py::arg("keep_all") = false)
        .def("eval", [](Session& s, I32Array tokens, int start_pos, bool all_logits) {
            const int n = int(tokens.size());
            const int rows = all_logits ? std::max(n, 1) : 1;
            py::array_t<float> out({py::ssize_t(rows), py::ssize_t(s.model().config().n_vocab)});
            const int32_t* t = tokens.data();
            float* o = out.mutable_data();
            {
                py::gil_scoped_release nogil;
                s.eval(t, n, start_pos, all_logits, o);
            }
            return out;
        }, py::arg("tokens"), py::arg("start_pos"), py::arg("all_logits") = false,
           "logits [n, vocab] (all_logits) or [1, vocab] for tokens at positions start_pos..")
        .def("plan", [](Session& s, int n_tokens, bool all_logits) { return &s.plan(n_tokens, all_logits); },
             py::arg("n_tokens"), py::arg("all_logits") = false, py::return_value_policy::reference_internal)
        .def_property_readonly("n_ctx", &Session::n_ctx)
        .def_property_readonly("threads", &Session::n_threads)
        .def_property_readonly("graph_builds", &Session::graph_builds)
        .def_property_readonly("backends", &Session::backend_names)
        .def("op_profile", [](const Session& s) {
            py::dict d;
            const OpProfile& p = s.op_profile();
            for (size_t i = 0; i < size_t(Op::Count); i++)
                if (p.calls[i]) d[op_name(Op(i))] = py::make_tuple(p.seconds[i], p.calls[i]);
            return d;
        });
}

}  // namespace minfer
