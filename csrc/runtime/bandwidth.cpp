#include "runtime/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace minfer {

double read_bandwidth_gbps(size_t bytes, int reps, ThreadPool& pool) {
    const size_t n = bytes / sizeof(uint64_t);
    std::vector<uint64_t> buf(n);
    // first touch in parallel, so pages land near the threads that read them
    const int64_t chunks = int64_t(pool.size()) * 16;
    pool.parallel_for(chunks, [&](int64_t c, int) {
        size_t lo = n * size_t(c) / size_t(chunks), hi = n * size_t(c + 1) / size_t(chunks);
        for (size_t i = lo; i < hi; i++) buf[i] = i;
    });
    std::atomic<uint64_t> sink{0};
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(chunks, [&](int64_t c, int) {
            size_t lo = n * size_t(c) / size_t(chunks), hi = n * size_t(c + 1) / size_t(chunks);
            uint64_t a = 0, b = 0, d = 0, e = 0;  // independent sums: the loop is load-bound
            size_t i = lo;
            for (; i + 4 <= hi; i += 4) {
                a += buf[i];
                b += buf[i + 1];
                d += buf[i + 2];
                e += buf[i + 3];
            }
            for (; i < hi; i++) a += buf[i];
            sink += a + b + d + e;
        });
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(n * sizeof(uint64_t)) / s / 1e9);
    }
    return sink.load() == 42 ? best + 0.0 : best;  // keep the sums alive
}

}  // namespace minfer
