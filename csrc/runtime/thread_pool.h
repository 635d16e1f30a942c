// A small fork-join thread pool for the CPU kernels.
//
// parallel_for(n, fn) runs fn(task, thread) for every task in [0, n) on all
// threads (the caller is thread 0) and returns when all are done.  Tasks are
// claimed from an atomic counter, so uneven tasks balance themselves.  Idle
// workers spin for a short while before sleeping on a condition variable: a
// decode step issues hundreds of parallel_for calls back to back, and waking a
// sleeping thread costs more than the work of a small one.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace minfer {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);  // total threads, caller included; >= 1
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }
    void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn);
    // Items [0, n) cut into one contiguous share per thread.  A share's owner walks it from the front, a
    // sixteenth of what is left a claim (at least `grain` items); a thread whose share is done takes `grain`
    // items a claim from the back of the share with the most left, so the threads finish together while each
    // still reads one long forward run (a decode matvec's rows: equal shares finish apart by however much
    // faster one core's memory is that moment).  fn(first, last, thread) runs once per claim [first, last).
    // n < 2^32.
    void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t first, int64_t last, int thread)>& fn);

  private:
    void worker_loop(int thread);
    void run_tasks(int thread);

    int n_threads_;
    std::vector<std::thread> workers_;
    std::mutex call_mutex_;  // one parallel_for at a time (the pool is shared)

    // The current job, published by bumping generation_.
    const std::function<void(int64_t, int)>* job_ = nullptr;
    int64_t n_tasks_ = 0;
    std::atomic<int64_t> next_task_{0};
    std::atomic<int> busy_workers_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<bool> stop_{false};
    std::exception_ptr error_;
    std::mutex error_mutex_;

    std::mutex sleep_mutex_;
    std::condition_variable wake_;
};

// Physical cores of this machine (hyper-threads not counted); at least 1.
int physical_cores();

}  // namespace minfer
