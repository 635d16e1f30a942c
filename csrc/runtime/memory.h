// How much memory this process may still take, so that a KV cache or a buffer
// that cannot fit is refused up front with a clear error, instead of Linux
// overcommitting it and the OOM killer ending the process mid-generation.
#pragma once
#include <cstddef>
#include <string>

namespace minfer {

struct MemoryBudget {
    size_t bytes = 0;     // the tightest of the limits below
    std::string source;   // which limit that is: "MemAvailable", "RLIMIT_AS", "cgroup memory.max"
};

// min(MemAvailable, RLIMIT_AS headroom, cgroup v2 headroom); SIZE_MAX where none is known.
MemoryBudget memory_budget();

// Throws OutOfMemoryError naming `what` (and ending with `hint`) when `bytes` exceeds the budget.
void check_fits(size_t bytes, const std::string& what, const std::string& hint = "");

}  // namespace minfer
