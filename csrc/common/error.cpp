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

std::string valid_utf8(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    const unsigned char* p = (const unsigned char*)s.data();
    size_t n = s.size(), i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = (p[i + k] & 0xc0) == 0x80;
        if (ok && len == 2) ok = c >= 0xc2;                                       // no overlong forms
        if (ok && len == 3) {
            unsigned cp = (c & 0xf) << 12 | (p[i + 1] & 0x3f) << 6 | (p[i + 2] & 0x3f);
            ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);                      // no surrogates
        }
        if (ok && len == 4) {
            unsigned cp = (c & 0x7) << 18 | (p[i + 1] & 0x3f) << 12 | (p[i + 2] & 0x3f) << 6 | (p[i + 3] & 0x3f);
            ok = cp >= 0x10000 && cp <= 0x10ffff;
        }
        if (ok) {
            out.append(s, i, len);
            i += len;
        } else {
            out.push_back('?');
            i++;
        }
    }
    return out;
}

}  // namespace minfer
