#include "backends/offload.h"

#include <string>

#include "common/error.h"
#include "common/settings.h"

namespace minfer {

std::set<Op> cpu_ops_setting() {
    std::set<Op> ops;
    const std::string list = setting_text("MINFER_CPU_OPS");
    for (size_t at = 0; at < list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string tok = list.substr(at, end - at);
        at = end + 1;
        if (tok.empty()) continue;
        bool found = false;
        for (size_t i = 0; i < size_t(Op::Count); i++)
            if (tok == op_name(Op(i))) ops.insert(Op(i)), found = true;
        if (!found) throw MinferError(strfmt("MINFER_CPU_OPS='%s': unknown op '%s'", list.c_str(), tok.c_str()));
    }
    return ops;
}

double gpu_timeout_s() { return setting_number("MINFER_GPU_TIMEOUT_S"); }

}  // namespace minfer
