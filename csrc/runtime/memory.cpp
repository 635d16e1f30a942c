#include "runtime/memory.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sys/resource.h>

#include "common/error.h"

namespace minfer {

namespace {

// A "Key:   123 kB" line of a /proc file, in bytes; 0 when absent.
size_t proc_kb(const char* path, const char* key) {
    FILE* f = std::fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t out = 0, klen = std::strlen(key);
    while (std::fgets(line, sizeof line, f))
        if (std::strncmp(line, key, klen) == 0 && line[klen] == ':') {
            unsigned long long kb = 0;
            if (std::sscanf(line + klen + 1, "%llu", &kb) == 1) out = size_t(kb) * 1024;
            break;
        }
    std::fclose(f);
    return out;
}

// The first number in a file ("max" and missing files read as 0 = unknown).
size_t file_number(const char* path) {
    FILE* f = std::fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    if (std::fscanf(f, "%llu", &v) != 1) v = 0;
    std::fclose(f);
    return size_t(v);
}

void tighten(MemoryBudget& b, size_t bytes, const char* source) {
    if (bytes < b.bytes) b = {bytes, source};
}

}  // namespace

MemoryBudget memory_budget() {
    MemoryBudget b{SIZE_MAX, "no known limit"};
#ifdef __linux__
    if (size_t avail = proc_kb("/proc/meminfo", "MemAvailable")) tighten(b, avail, "MemAvailable");
    // cgroup v2 (containers): the group's limit minus what it already uses.
    if (size_t max = file_number("/sys/fs/cgroup/memory.max")) {
        size_t cur = file_number("/sys/fs/cgroup/memory.current");
        tighten(b, max > cur ? max - cur : 0, "cgroup memory.max");
    }
#endif
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        size_t used = proc_kb("/proc/self/status", "VmSize");
        size_t lim = size_t(rl.rlim_cur);
        tighten(b, lim > used ? lim - used : 0, "RLIMIT_AS");
    }
    return b;
}

void check_fits(size_t bytes, const std::string& what, const std::string& hint) {
    MemoryBudget b = memory_budget();
    if (bytes > b.bytes)
        throw OutOfMemoryError(strfmt("%s needs %.1f MiB but only %.1f MiB of memory is available (%s)%s", what.c_str(),
                                      double(bytes) / 1048576.0, double(b.bytes) / 1048576.0, b.source.c_str(),
                                      hint.empty() ? "" : ("; " + hint).c_str()));
}

}  // namespace minfer
