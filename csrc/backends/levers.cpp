#include "backends/levers.h"

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace minfer {

std::set<Op> ops_from_env(const char* var) {
    std::set<Op> ops;
    const char* v = std::getenv(var);
    if (!v) return ops;
    const std::string list = v;
    for (size_t at = 0; at <= list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string tok = list.substr(at, end - at);
        at = end + 1;
        if (tok.empty()) continue;
        bool found = false;
        for (size_t i = 0; i < size_t(Op::Count); i++)
            if (tok == op_name(Op(i))) ops.insert(Op(i)), found = true;
        if (!found) throw MinferError(strfmt("%s: unknown op '%s'", var, tok.c_str()));
    }
    return ops;
}

double seconds_from_env(const char* var, double fallback) {
    const char* v = std::getenv(var);
    if (!v) return fallback;
    const double s = std::atof(v);
    if (!(s > 0)) throw MinferError(strfmt("%s must be a positive number of seconds, got '%s'", var, v));
    return s;
}

}  // namespace minfer
