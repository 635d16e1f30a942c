// libdispatch's semaphore for the mock Metal device on Linux (Debian has no
// libdispatch): a counter under a mutex, with a timed wait.
#include <dispatch/dispatch.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

struct dispatch_semaphore_s {
    std::mutex mu;
    std::condition_variable cv;
    long count;
};

extern "C" dispatch_semaphore_t dispatch_semaphore_create(long value) { return new dispatch_semaphore_s{{}, {}, value}; }

extern "C" long dispatch_semaphore_signal(dispatch_semaphore_t s) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->count++;
    s->cv.notify_one();
    return 0;
}

// dispatch_time values here are absolute steady-clock nanoseconds.
extern "C" dispatch_time_t dispatch_time(dispatch_time_t when, int64_t delta) {
    const uint64_t now = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch()).count());
    return (when == DISPATCH_TIME_NOW ? now : when) + uint64_t(delta);
}

extern "C" long dispatch_semaphore_wait(dispatch_semaphore_t s, dispatch_time_t timeout) {
    std::unique_lock<std::mutex> lock(s->mu);
    const auto deadline = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(timeout));
    while (s->count <= 0)
        if (timeout != DISPATCH_TIME_FOREVER && s->cv.wait_until(lock, deadline) == std::cv_status::timeout &&
            s->count <= 0)
            return 1;  // timed out
        else if (timeout == DISPATCH_TIME_FOREVER)
            s->cv.wait(lock);
    s->count--;
    return 0;
}

extern "C" void dispatch_release(void* object) { delete (dispatch_semaphore_s*)object; }
