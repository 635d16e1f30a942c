// The engine's design objects from Python: Graph (an architecture's graph for a step, or one built op by op),
// Backend (a device: name, what it fuses) and Scheduler (assignment, fusion, allocation and splits over its
// backends; runs a plan).  minfer.engine.greedy is written on them; Session (bind_engine.cpp) is the
// convenience over a Scheduler for one sequence.
#include <cstring>

#include "engine/session.h"
#include "python/bind_engine_util.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace minfer {

namespace {

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

InputKind input_kind(const std::string& s) {
    if (s == "tokens") return InputKind::Tokens;
    if (s == "positions") return InputKind::Positions;
    if (s == "data") return InputKind::Data;
    throw py::value_error("input kind must be 'tokens', 'positions' or 'data', got '" + s + "'");
}

}  // namespace

void bind_scheduler(py::module_& m) {
    py::class_<Graph>(m, "Graph", "a graph of ops: an architecture's step (Graph.decoder) or built op by op")
        .def(py::init<>())
        .def_static("decoder", [](const Scheduler& s, int n_tokens, bool all_logits) {
            if (n_tokens < 1) throw py::value_error("n_tokens must be >= 1");
            return s.model().config().graph(s.step_params(n_tokens, all_logits));
        }, py::arg("scheduler"), py::arg("n_tokens"), py::arg("all_logits") = false,
           "the model's graph for a step of n_tokens under the scheduler's options (KV type, context, fusion)")
        .def("input", [](Graph& g, int rows, int cols, const std::string& kind) {
            if (rows < 1 || cols < 1) throw py::value_error("an input needs rows >= 1 and cols >= 1");
            Node n;
            n.op = Op::Input;
            n.meta.input = input_kind(kind);
            n.rows = rows;
            n.cols = cols;
            n.name = "input" + std::to_string(g.nodes.size());
            return g.add(std::move(n));
        }, py::arg("rows"), py::arg("cols"), py::arg("kind") = "data", "adds an input node; returns its index")
        .def("add", [](Graph& g, const std::string& op, const py::list& inputs, int rows, int cols, const py::dict& meta,
                       const std::string& name) {
            Node n;
            n.op = op_from(op);
            n.rows = rows;
            n.cols = cols;
            n.name = name.empty() ? std::string(op_name(n.op)) : name;
            n.in = inputs_from(inputs, int(g.nodes.size()));
            meta_from(n.meta, meta);
            const int i = g.add(std::move(n));
            g.output = i;
            return i;
        }, py::arg("op"), py::arg("inputs"), py::arg("rows"), py::arg("cols"), py::arg("meta") = py::dict(),
           py::arg("name") = "",
           "adds a node (inputs: node indices, or (node, first column, columns) windows); it becomes the output")
        .def_property("output", [](const Graph& g) { return g.output; }, [](Graph& g, int i) {
            if (i < 0 || size_t(i) >= g.nodes.size()) throw py::index_error("no such node");
            g.output = i;
        })
        .def_property_readonly("nodes", [](const Graph& g) {
            py::list out;
            for (const Node& n : g.nodes) out.append(node_dict(n));
            return out;
        })
        .def_property_readonly("n_tokens", [](const Graph& g) { return g.params.n_tokens; });

    py::class_<Backend, std::unique_ptr<Backend, py::nodelete>>(m, "Backend", "one device of a scheduler")
        .def_property_readonly("name", [](const Backend& b) { return std::string(b.name()); })
        .def("supports_fused", [](const Backend& b, const std::string& op) { return b.supports_fused(op_from(op)); },
             py::arg("op"), "whether this backend has a kernel for a fused op (FusedQKV, AddRmsNorm, ...)")
        .def("__repr__", [](const Backend& b) { return std::string("<minfer Backend ") + b.name() + ">"; });

    py::class_<Scheduler>(m, "Scheduler", "assigns, fuses, allocates and splits graphs over its backends; runs plans")
        .def(py::init([](std::shared_ptr<Model> model, int n_ctx, int threads, const std::string& kv_type,
                         const std::string& isa, const std::string& device, bool fuse) {
                 return std::make_unique<Scheduler>(std::move(model),
                                                    scheduler_options(n_ctx, threads, kv_type, isa, device, fuse));
             }),
             py::arg("model"), py::arg("n_ctx") = 0, py::arg("threads") = 0, py::arg("kv_type") = "f16",
             py::arg("isa") = "", py::arg("device") = "", py::arg("fuse") = true)
        .def_property_readonly("backends", [](py::object self) {
            py::list out;  // each keeps the scheduler alive
            for (const auto& b : self.cast<const Scheduler&>().backends())
                out.append(py::cast(b.get(), py::return_value_policy::reference_internal, self));
            return out;
        }, "the backends in priority order (the reference backend last: forced assignments only)")
        .def("schedule", [](Scheduler& s, Graph g, const std::string& assignment, py::object fuse, bool keep_all) {
            if (g.nodes.empty() || g.output < 0) throw py::value_error("schedule: the graph has no nodes");
            if (!assignment.empty()) g.params.assignment = assignment;
            if (!fuse.is_none()) g.params.fuse = fuse.cast<bool>();
            return s.schedule(std::move(g), nullptr, keep_all);
        }, py::arg("graph"), py::arg("assignment") = "", py::arg("fuse") = py::none(), py::arg("keep_all") = false,
           py::keep_alive<0, 1>(),
           "a Plan: the graph's nodes assigned to backends (priority order, or 'only:NAME' / 'alternate:K'), fused, "
           "allocated and split")
        .def("run", [](Scheduler& s, Plan& p) {
            py::gil_scoped_release nogil;
            s.run(p);
        }, py::arg("plan"), "executes a plan whose inputs are written (Plan.write)")
        .def("step", [](Scheduler& s, Plan& p, I32Array tokens, int start_pos) {
            const int n = int(tokens.size());
            const int32_t* t = tokens.data();
            py::gil_scoped_release nogil;
            s.write_step(p, t, n, start_pos);
            s.run(p);
        }, py::arg("plan"), py::arg("tokens"), py::arg("start_pos"),
           "runs a model step: tokens at positions start_pos.. (checked), then the plan; read the output with Plan.read")
        .def("step_greedy", [](Scheduler& s, Plan& p, I32Array tokens, int start_pos) {
            const int n = int(tokens.size());
            const int32_t* t = tokens.data();
            py::gil_scoped_release nogil;
            s.write_step(p, t, n, start_pos);
            s.run(p, false);  // the argmax is enqueued behind the step: one wait
            return p.argmax_last_row(p.graph().output);
        }, py::arg("plan"), py::arg("tokens"), py::arg("start_pos"),
           "runs a model step and returns the argmax of its last row (found where the logits are)")
        .def("greedy_chain", [](Scheduler& s, Plan& p, int token, int start_pos, int steps) {
            if (steps < 1) throw py::value_error("steps must be >= 1");
            py::array_t<int32_t> out(py::ssize_t{steps});
            int32_t* o = out.mutable_data();
            {
                py::gil_scoped_release nogil;
                s.greedy_chain(p, token, start_pos, steps, o);
            }
            return out;
        }, py::arg("plan"), py::arg("token"), py::arg("start_pos"), py::arg("steps"),
           "greedy one-token steps of a one-token plan (chained on the device where it can)")
        .def_property_readonly("n_ctx", &Scheduler::n_ctx)
        .def_property_readonly("threads", &Scheduler::n_threads)
        .def_property_readonly("device", &Scheduler::device)
        .def_property_readonly("chained_steps", &Scheduler::chained_steps)
        .def_property_readonly("model", &Scheduler::model_ptr);
}

}  // namespace minfer
