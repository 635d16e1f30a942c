#include "graph/ir.h"

namespace minfer {

const char* op_name(Op op) {
    static const char* names[] = {"Input", "GetRows", "TailRow", "RmsNorm", "QkNorm", "MatMul",
                                  "Rope", "KvStore", "Attn", "Add", "Mul", "Silu",
                                  "SwiGLU", "FusedQKV", "FusedQkvNorm", "FusedFFN", "RopeKvStore",
                                  "AddRmsNorm", "FusedQkvRope", "PickRows", "Gelu", "GeGLU", "Scale",
                                  "SoftCap"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(Op::Count), "op names");
    return unsigned(op) < unsigned(Op::Count) ? names[unsigned(op)] : "?";
}

std::vector<std::string> Graph::weights_of(const Node& n) {
    std::vector<std::string> out;
    for (const std::string* s : {&n.meta.weight, &n.meta.bias, &n.meta.wq, &n.meta.wk, &n.meta.wv, &n.meta.bq,
                                 &n.meta.bk, &n.meta.bv, &n.meta.q_norm, &n.meta.k_norm, &n.meta.w_gate,
                                 &n.meta.w_up})
        if (!s->empty()) out.push_back(*s);
    return out;
}

}  // namespace minfer
