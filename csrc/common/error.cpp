#include "common/error.h"

#include <cstdio>
#include <vector>

namespace minfer {

std::string strfmt(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::vector<char> buf(n > 0 ? size_t(n) + 1 : 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    va_end(ap2);
    return std::string(buf.data(), n > 0 ? size_t(n) : 0);
}

}  // namespace minfer
