#include "common/error.h"
#include "graph/passes.h"

namespace minfer {

namespace {
int find_named(const std::vector<BackendSlot>& slots, const char* name) {
    for (size_t i = 0; i < slots.size(); i++)
        if (std::string(slots[i].backend->name()) == name) return int(i);
    return -1;
}
}  // namespace

void assign_backends(Graph& g, const std::vector<BackendSlot>& slots, const std::string& pattern) {
    int period = 0;
    int alt[2] = {-1, -1};
    int only = -1;
    if (pattern.rfind("only:", 0) == 0) {  // every node on one named backend
        only = find_named(slots, pattern.c_str() + 5);
        if (only < 0) throw MinferError(strfmt("assignment '%s': no such backend", pattern.c_str()));
    } else if (!pattern.empty()) {
        if (pattern.rfind("alternate:", 0) != 0 || (period = std::atoi(pattern.c_str() + 10)) <= 0)
            throw MinferError(strfmt("unknown backend assignment pattern '%s' (expected alternate:K, K >= 1, or only:NAME)", pattern.c_str()));
        alt[0] = find_named(slots, "cpu");
        alt[1] = find_named(slots, "reference");
        if (alt[0] < 0 || alt[1] < 0)
            throw MinferError("assignment pattern 'alternate:K' needs both the cpu and the reference backend");
    }
    for (size_t i = 0; i < g.nodes.size(); i++) {
        Node& n = g.nodes[i];
        n.backend = -1;
        if (n.op == Op::Attn) {  // the KV cache's backend
            n.backend = g.nodes[size_t(n.in[2].node)].backend;
            if (!slots[size_t(n.backend)].backend->supports_op(n))
                throw MinferError(strfmt("node '%s': backend %s holds the KV cache but cannot run Attn", n.name.c_str(),
                                         slots[size_t(n.backend)].backend->name()));
            continue;
        }
        if (only >= 0) {
            n.backend = slots[size_t(only)].backend->supports_op(n) ? only : -1;
        } else if (period) {
            int first = alt[(i / size_t(period)) % 2], second = alt[1 - (i / size_t(period)) % 2];
            n.backend = slots[size_t(first)].backend->supports_op(n) ? first
                      : slots[size_t(second)].backend->supports_op(n) ? second : -1;
        } else {
            for (size_t b = 0; b < slots.size() && n.backend < 0; b++)
                if (slots[b].participates && slots[b].auto_assign && slots[b].backend->supports_op(n)) n.backend = int(b);
        }
        if (n.backend < 0)
            throw MinferError(strfmt("no backend can run node '%s' (op %s)", n.name.c_str(), op_name(n.op)));
    }
}

}  // namespace minfer
