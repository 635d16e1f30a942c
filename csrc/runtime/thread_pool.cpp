#include "runtime/thread_pool.h"

#include "common/error.h"

#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax() { asm volatile("yield"); }
#else
static inline void cpu_relax() {}
#endif

namespace minfer {

namespace {
constexpr int kSpinIterations = 1 << 14;  // ~ tens of microseconds before sleeping
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int t = 1; t < n_threads_; t++) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(sleep_mutex_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::run_tasks(int thread) {
    for (;;) {
        int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
        if (task >= n_tasks_) return;
        try {
            (*job_)(task, thread);
        } catch (...) {
            std::lock_guard<std::mutex> lk(error_mutex_);
            if (!error_) error_ = std::current_exception();
            next_task_.store(n_tasks_);  // stop handing out work
        }
    }
}

void ThreadPool::worker_loop(int thread) {
    uint64_t seen = 0;
    for (;;) {
        // Wait for a new generation: spin first, then sleep.
        uint64_t gen = generation_.load(std::memory_order_acquire);
        for (int i = 0; gen == seen && i < kSpinIterations; i++) {
            cpu_relax();
            gen = generation_.load(std::memory_order_acquire);
        }
        if (gen == seen) {
            std::unique_lock<std::mutex> lk(sleep_mutex_);
            wake_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen; });
            gen = generation_.load(std::memory_order_acquire);
        }
        seen = gen;
        if (stop_.load()) return;
        run_tasks(thread);
        busy_workers_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
    if (n_tasks <= 0) return;
    std::lock_guard<std::mutex> call(call_mutex_);
    if (n_threads_ == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(t, 0);
        return;
    }
    job_ = &fn;
    n_tasks_ = n_tasks;
    error_ = nullptr;
    next_task_.store(0, std::memory_order_relaxed);
    busy_workers_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        // Publishing under the mutex pairs with the sleepers' predicate check.
        std::lock_guard<std::mutex> lk(sleep_mutex_);
        generation_.fetch_add(1, std::memory_order_acq_rel);
    }
    wake_.notify_all();
    run_tasks(0);
    while (busy_workers_.load(std::memory_order_acquire) != 0) cpu_relax();
    job_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

namespace {
// A share's remaining items [lo, hi), packed into one word so that front and back claims cannot overlap.
uint64_t pack(uint64_t lo, uint64_t hi) { return lo | hi << 32; }

bool claim(std::atomic<uint64_t>& share, int64_t grain, bool front, int64_t* first, int64_t* last) {
    uint64_t v = share.load(std::memory_order_relaxed);
    for (;;) {
        const int64_t lo = int64_t(v & 0xffffffffu), hi = int64_t(v >> 32);
        if (lo >= hi) return false;
        // the owner takes a sixteenth of what is left (long runs, few claims), down to `grain`; a thief `grain`
        int64_t take = front && (hi - lo) / 16 > grain ? (hi - lo) / 16 : grain;
        take = hi - lo < take ? hi - lo : take;
        const uint64_t nv = front ? pack(uint64_t(lo + take), uint64_t(hi)) : pack(uint64_t(lo), uint64_t(hi - take));
        if (share.compare_exchange_weak(v, nv, std::memory_order_relaxed)) {
            *first = front ? lo : hi - take;
            *last = front ? lo + take : hi;
            return true;
        }
    }
}
}  // namespace

void ThreadPool::parallel_ranges(int64_t n, int64_t grain,
                                 const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    if (n >> 32) throw MinferError(strfmt("parallel_ranges: %lld items (at most 2^32 - 1)", (long long)n));
    if (grain < 1) grain = 1;
    const int T = n_threads_;
    if (T == 1) return fn(0, n, 0);
    std::unique_ptr<std::atomic<uint64_t>[]> shares(new std::atomic<uint64_t>[size_t(T)]);
    for (int t = 0; t < T; t++) shares[size_t(t)].store(pack(uint64_t(n * t / T), uint64_t(n * (t + 1) / T)));
    // one task per share: whoever takes task k owns share k
    parallel_for(T, [&](int64_t k, int thread) {
        int64_t a, b;
        while (claim(shares[size_t(k)], grain, true, &a, &b)) fn(a, b, thread);
        for (;;) {  // then from the back of the share with the most left
            int victim = -1;
            int64_t most = 0;
            for (int t = 0; t < T; t++) {
                const uint64_t v = shares[size_t(t)].load(std::memory_order_relaxed);
                const int64_t left = int64_t(v >> 32) - int64_t(v & 0xffffffffu);
                if (left > most) most = left, victim = t;
            }
            if (victim < 0) return;
            if (claim(shares[size_t(victim)], grain, false, &a, &b)) fn(a, b, thread);
        }
    });
}

int physical_cores() {
    // Count distinct (package, core) pairs from sysfs; fall back to the logical count.
    std::set<std::pair<std::string, std::string>> cores;
    unsigned n_logical = std::thread::hardware_concurrency();
    for (unsigned cpu = 0; cpu < (n_logical ? n_logical : 1); cpu++) {
        std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
        std::string p, c;
        if (!(pkg >> p) || !(core >> c)) { cores.clear(); break; }
        cores.insert({p, c});
    }
    if (!cores.empty()) return int(cores.size());
    return n_logical ? int(n_logical) : 1;
}

}  // namespace minfer
