#include "runtime/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include <sys/mman.h>

#include "common/error.h"
#include "common/huge_pages.h"

namespace minfer {

// The buffer is asked for 2 MB pages (MADV_HUGEPAGE), as the weights get them where the page cache holds
// the model in 2 MB folios (gguf/mapped_file.cpp): the ceiling is the machine's, not that of a 4 KB-page walk
// (2 threads on the development machine: 24-26 GB/s from 4 KB pages, 36 from 2 MB ones).
double read_bandwidth_gbps(size_t bytes, int reps, ThreadPool& pool) {
    const size_t n = bytes / sizeof(uint64_t);
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t span = (n * sizeof(uint64_t) + kHuge - 1) / kHuge * kHuge;
    void* mem = mmap(nullptr, span + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) throw OutOfMemoryError(strfmt("bandwidth probe: cannot map %zu bytes", span));
    struct Unmap {
        void* p;
        size_t n;
        ~Unmap() { munmap(p, n); }
    } unmap{mem, span + kHuge};
    uint64_t* buf = (uint64_t*)((uintptr_t(mem) + kHuge - 1) & ~uintptr_t(kHuge - 1));
    advise_huge_pages(buf, span);
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
