// Conversions the engine bindings share: KV type names, op names, node metadata and inputs from Python
// dicts and lists, a node as a dict.
#include "python/bind_engine_util.h"

#include "quant/types.h"

namespace py = pybind11;

namespace minfer {

uint32_t kv_type_from(const std::string& s) {
    if (s == "f16") return GGML_TYPE_F16;
    if (s == "f32") return GGML_TYPE_F32;
    if (s == "q8_0") return GGML_TYPE_Q8_0;
    throw py::value_error("kv_type must be 'f16', 'f32' or 'q8_0', got '" + s + "'");
}

py::dict node_dict(const Node& n) {
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
    if (!n.meta.feeds_q.empty()) d["feeds_q"] = n.meta.feeds_q;
    if (!n.meta.feeds.empty()) d["feeds"] = n.meta.feeds;
    return d;
}

Op op_from(const std::string& s) {
    for (size_t i = 0; i < size_t(Op::Count); i++)
        if (s == op_name(Op(i))) return Op(i);
    throw py::value_error("unknown op '" + s + "'");
}

void meta_from(NodeMeta& m, const py::dict& d) {
    for (auto item : d) {
        std::string k = py::str(item.first);
        py::handle v = item.second;
        if (k == "weight") m.weight = py::str(v);
        else if (k == "bias") m.bias = py::str(v);
        else if (k == "wq") m.wq = py::str(v);
        else if (k == "wk") m.wk = py::str(v);
        else if (k == "wv") m.wv = py::str(v);
        else if (k == "bq") m.bq = py::str(v);
        else if (k == "bk") m.bk = py::str(v);
        else if (k == "bv") m.bv = py::str(v);
        else if (k == "q_norm") m.q_norm = py::str(v);
        else if (k == "k_norm") m.k_norm = py::str(v);
        else if (k == "w_gate") m.w_gate = py::str(v);
        else if (k == "w_up") m.w_up = py::str(v);
        else if (k == "eps") m.eps = v.cast<float>();
        else if (k == "n_head") m.n_head = v.cast<int>();
        else if (k == "n_head_kv") m.n_head_kv = v.cast<int>();
        else if (k == "head_dim") m.head_dim = v.cast<int>();
        else if (k == "q_cols") m.q_cols = v.cast<int>();
        else if (k == "k_cols") m.k_cols = v.cast<int>();
        else if (k == "v_cols") m.v_cols = v.cast<int>();
        else if (k == "rope_base") m.rope_base = v.cast<float>();
        else if (k == "rope_scale") m.rope_scale = v.cast<float>();
        else if (k == "rope_dim") m.rope_dim = v.cast<int>();
        else if (k == "rope_neox") m.rope_neox = v.cast<bool>();
        else if (k == "attn_scale") m.attn_scale = v.cast<float>();
        else if (k == "window") m.window = v.cast<int>();
        else if (k == "scale") m.scale = v.cast<float>();
        else if (k == "act") {
            const std::string a = py::str(v);
            if (a != "silu" && a != "gelu") throw py::value_error("act must be 'silu' or 'gelu', got '" + a + "'");
            m.act = a == "gelu" ? Act::Gelu : Act::Silu;
        }
        else if (k == "kv_type") m.kv_type = kv_type_from(py::str(v));
        else if (k == "n_ctx") m.n_ctx = v.cast<int>();
        else if (k == "src_row") m.src_row = v.cast<int>();
        else if (k == "block_size") m.block_size = v.cast<int>();
        else if (k == "layer") m.layer = v.cast<int>();
        else if (k == "role") {
            const std::string r = py::str(v);
            const char* names[] = {"", "q", "k", "v", "gate", "up"};
            int i = 0;
            while (i < 6 && r != names[i]) i++;
            if (i == 6) throw py::value_error("role must be 'q', 'k', 'v', 'gate' or 'up', got '" + r + "'");
            m.role = Role(i);
        }
        else if (k == "feeds_q") m.feeds_q = py::str(v);
        else if (k == "feeds") m.feeds = py::str(v);
        else throw py::value_error("unknown node meta key '" + k + "'");
    }
}

SchedulerOptions scheduler_options(int n_ctx, int threads, const std::string& kv_type, const std::string& isa,
                                   const std::string& device, bool fuse) {
    SchedulerOptions o;
    o.n_ctx = n_ctx;
    o.n_threads = threads;
    o.kv_type = kv_type_from(kv_type);
    o.isa = isa;
    o.device = device;
    o.fuse = fuse;
    return o;
}

std::vector<NodeInput> inputs_from(const py::list& inputs, int n_before) {
    std::vector<NodeInput> out;
    for (py::handle in : inputs) {
        if (py::isinstance<py::tuple>(in)) {
            auto t = in.cast<std::tuple<int, int, int>>();
            out.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t)});
        } else {
            out.push_back({in.cast<int>(), 0, -1});
        }
        if (out.back().node < 0 || out.back().node >= n_before)
            throw py::value_error("a node input must name an earlier node");
    }
    return out;
}

}  // namespace minfer
