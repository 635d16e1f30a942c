// A streaming-read probe: how fast this machine's threads can read memory,
// the ceiling for decode (every weight byte is read once per token).
#pragma once
#include <cstddef>

#include "runtime/thread_pool.h"

namespace minfer {

// Reads a `bytes`-sized buffer `reps` times with the pool's threads; returns the best GB/s.
double read_bandwidth_gbps(size_t bytes, int reps, ThreadPool& pool);

}  // namespace minfer
