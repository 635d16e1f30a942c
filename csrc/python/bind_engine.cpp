// Engine bindings: Model, Session and Plan, so the decode loop in python/minfer
// is written against the engine's own objects and a user can build a plan,
// inspect its nodes and splits, run it and read any node's output.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "python/bind_engine_util.h"
#include "python/bindings.h"
#include "engine/session.h"

namespace py = pybind11;

namespace minfer {

namespace {

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

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
            d["rope_scale"] = c.rope_scale;
            d["rope_dim"] = c.rope_dim;
            d["rope_neox"] = c.rope_neox;
            d["output_weight"] = c.output_weight;
            d["sliding_window"] = c.swa_window;
            d["local_layers"] = [&c] {
                py::list l;
                for (int i = 0; i < c.n_layer; i++)
                    if (c.is_local(i)) l.append(i);
                return l;
            }();
            return d;
        })
        .def_property_readonly("weight_bytes", [](const Model& mdl) { return mdl.weights().total_bytes(); })
        .def("default_context", [](const Model& mdl, const std::string& kv_type, const std::string& device) {
                 return default_context(mdl, kv_type_from(kv_type), device);
             }, py::arg("kv_type") = "f16", py::arg("device") = "",
             "The context a session of this model gets when it names none (see the README's KV paragraph).");

    py::class_<Plan>(m, "Plan")
        .def_property_readonly("nodes", [](const Plan& p) {
            py::list out;
            for (const Node& n : p.graph().nodes) out.append(node_dict(n));
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
        .def("write", [](Plan& p, int node, py::array_t<float, py::array::c_style | py::array::forcecast> a) {
            if (node < 0 || size_t(node) >= p.graph().nodes.size()) throw py::index_error("no such node");
            const Node& n = p.graph().nodes[size_t(node)];
            if (n.op != Op::Input || size_t(a.size()) != size_t(n.rows) * size_t(n.cols))
                throw py::value_error(strfmt("Plan.write: node %d is not an input of %d x %d values", node, n.rows, n.cols));
            p.write_node(node, a.data(), size_t(a.size()));
        }, py::arg("node"), py::arg("values"), "writes an input node's values (a hand-built graph's data inputs)")
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
                         const std::string& isa, const std::string& assignment, bool fuse, bool keep_all,
                         const std::string& device) {
                 SessionOptions o = scheduler_options(n_ctx, threads, kv_type, isa, device, fuse);
                 o.assignment = assignment;
                 o.keep_all = keep_all;
                 return std::make_unique<Session>(std::move(model), o);
             }),
             py::arg("model"), py::arg("n_ctx") = 0, py::arg("threads") = 0, py::arg("kv_type") = "f16",
             py::arg("isa") = "", py::arg("assignment") = "", py::arg("fuse") = true, py::arg("keep_all") = false,
             py::arg("device") = "")
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
        .def("eval_greedy", [](Session& s, I32Array tokens, int start_pos, const py::object& allow) {
            const int n = int(tokens.size());
            const int32_t* t = tokens.data();
            py::object hold;
            const Plan::AllowFn fn = allow_fn(allow, 1, s.model().config().n_vocab, hold);
            py::gil_scoped_release nogil;
            return s.eval_greedy(t, n, start_pos, fn);
        }, py::arg("tokens"), py::arg("start_pos"), py::arg("allow") = py::none(),
           "the argmax of the last position's logits (found on the device; only the token id is read back); "
           "allow: constrained decoding's token bitmask, or a callable returning it (called while the step runs)")
        .def("eval_best", [](Session& s, I32Array tokens, int start_pos, int k) {
            const int n = int(tokens.size());
            py::array_t<float> vals(py::ssize_t{std::max(k, 0)});
            py::array_t<int32_t> ids(py::ssize_t{std::max(k, 0)});
            float* v = vals.mutable_data();
            int32_t* t = ids.mutable_data();
            {
                py::gil_scoped_release nogil;
                s.eval_best(tokens.data(), n, start_pos, k, v, t);
            }
            return py::make_tuple(vals, ids);
        }, py::arg("tokens"), py::arg("start_pos"), py::arg("k"),
           "(values, ids): the last position's k best logits by value descending, then id, found where the logits "
           "are (only they are read back): what Sampler.sample_best takes")
        .def("decode_greedy", [](Session& s, int token, int start_pos, int steps) {
            py::array_t<int32_t> out(py::ssize_t{std::max(steps, 0)});  // the session refuses steps <= 0
            int32_t* o = out.mutable_data();
            {
                py::gil_scoped_release nogil;
                s.decode_greedy(token, start_pos, steps, o);
            }
            return out;
        }, py::arg("token"), py::arg("start_pos"), py::arg("steps"),
           "steps greedy one-token steps from token at start_pos: the tokens they pick, as eval_greedy in a loop "
           "would return them (on CUDA chained on the device: one wait per up to 256 steps)")
        .def("plan", [](Session& s, int n_tokens, bool all_logits) { return &s.plan(n_tokens, all_logits); },
             py::arg("n_tokens"), py::arg("all_logits") = false, py::return_value_policy::reference_internal)
        .def_property_readonly("chains", [](Session& s) { return s.plan(1, false).chains(); },
                               "whether decode_greedy chains its steps on the device (the host waits once a chunk)")
        .def_property_readonly("n_ctx", &Session::n_ctx)
        .def_property_readonly("threads", &Session::n_threads)
        .def_property_readonly("graph_builds", &Session::graph_builds)
        .def_property_readonly("chained_steps", &Session::chained_steps)
        .def_property_readonly("backends", &Session::backend_names)
        .def_property_readonly("device", &Session::device)
        .def_property_readonly("rewind_floor", &Session::rewind_floor,
                               "the earliest position a step may start at, other than 0 (local layers' KV rings)")
        .def_property_readonly("kv_bytes", &Session::kv_bytes, "bytes of KV cache allocated so far")
        .def_property_readonly("scheduler", &Session::scheduler, py::return_value_policy::reference_internal,
                               "the Scheduler this session runs its plans on")
        .def("run_ops", [](Session& s, const std::string& backend, const py::list& inputs, const py::list& nodes,
                           bool poison) {
            // A small graph over this model's weights: the inputs become Data nodes
            // 0..k-1, then `nodes` in order; returns every node's output.
            Graph g;
            g.params.assignment = "only:" + backend;
            g.params.fuse = false;
            std::vector<std::vector<float>> data;
            for (py::handle h : inputs) {
                py::array a = py::reinterpret_borrow<py::array>(h);
                if (a.ndim() != 2) throw py::value_error("run_ops inputs must be 2-D arrays");
                Node n;
                n.op = Op::Input;
                n.meta.input = InputKind::Data;
                n.rows = int(a.shape(0));
                n.cols = int(a.shape(1));
                n.name = "input" + std::to_string(g.nodes.size());
                std::vector<float> v(size_t(a.size()));
                if (a.dtype().is(py::dtype::of<int32_t>())) {
                    auto c = py::array_t<int32_t, py::array::c_style | py::array::forcecast>(a);
                    std::memcpy(v.data(), c.data(), v.size() * 4);
                } else {
                    auto c = py::array_t<float, py::array::c_style | py::array::forcecast>(a);
                    std::memcpy(v.data(), c.data(), v.size() * 4);
                }
                data.push_back(std::move(v));
                g.add(std::move(n));
            }
            int kv_type = -1, n_ctx = 0;
            for (py::handle h : nodes) {
                py::dict d = py::reinterpret_borrow<py::dict>(h);
                Node n;
                n.op = op_from(py::str(d["op"]));
                n.rows = d["rows"].cast<int>();
                n.cols = d["cols"].cast<int>();
                n.name = d.contains("name") ? std::string(py::str(d["name"])) : std::string(op_name(n.op));
                n.in = inputs_from(py::reinterpret_borrow<py::list>(d["inputs"]), int(g.nodes.size()));
                if (d.contains("meta")) meta_from(n.meta, d["meta"]);
                if (uses_kv(n.op)) {
                    kv_type = int(n.meta.kv_type);
                    n_ctx = n.meta.n_ctx;
                    if (n.meta.layer < 0) n.meta.layer = 0;
                }
                g.add(std::move(n));
            }
            g.output = int(g.nodes.size()) - 1;
            KvCache kv;
            if (kv_type >= 0) {
                kv.type = uint32_t(kv_type);
                kv.n_ctx = n_ctx;
            }
            std::unique_ptr<Plan> plan = s.plan_for(std::move(g), kv);
            for (size_t i = 0; i < data.size(); i++) plan->write_node(int(i), data[i].data(), data[i].size());
            if (poison) plan->poison();
            {
                py::gil_scoped_release nogil;
                plan->execute();
            }
            py::list out;
            for (size_t i = 0; i < plan->graph().nodes.size(); i++) {
                const Node& n = plan->graph().nodes[i];
                std::vector<float> v = plan->read_node(int(i));
                py::array_t<float> a({py::ssize_t(n.rows), py::ssize_t(std::max(1, n.cols))});
                std::memcpy(a.mutable_data(), v.data(), size_t(a.size()) * 4);
                out.append(a);
            }
            return out;
        }, py::arg("backend"), py::arg("inputs"), py::arg("nodes"), py::arg("poison") = true,
           "run a hand-built graph (inputs, then nodes) on one backend; returns every node's output")
        .def("op_profile", [](const Session& s) {
            py::dict d;
            const OpProfile& p = s.op_profile();
            for (size_t i = 0; i < size_t(Op::Count); i++)
                if (p.calls[i]) d[op_name(Op(i))] = py::make_tuple(p.seconds[i], p.calls[i]);
            return d;
        });
}

}  // namespace minfer
