// The MSL emulator's execution model: a dispatch runs its threadgroups one
// after another; the threads of a threadgroup run as fibers on one OS thread,
// switched only where MSL lets threads wait for each other -- a threadgroup
// barrier (released once every live thread of the group has arrived at the
// same barrier) and a SIMD-group collective (resolved once every live lane of
// the simdgroup has arrived).  Which runnable fiber goes next is drawn from a
// seeded generator, so a missing barrier shows up as a wrong answer under some
// seed rather than hiding behind a fixed order.  Errors (a barrier reached by
// only part of the group, lanes waiting on different collectives, a deadlock)
// abort the dispatch with a message.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

namespace msl {

constexpr int kSimdWidth = 32;
constexpr int kMaxBuffers = 16;

struct uint3_ {
    uint32_t x = 0, y = 0, z = 0;
};

// What the launcher of one kernel needs: bound buffers, threadgroup memory
// lengths, the grid (in threadgroups) and the threadgroup size (in threads).
struct Dispatch {
    void* buffers[kMaxBuffers] = {};
    size_t buffer_bytes[kMaxBuffers] = {};
    size_t tg_bytes[kMaxBuffers] = {};  // [[threadgroup(i)]] lengths
    uint3_ grid, tg;
    uint64_t seed = 0;
};

// Per-thread built-ins, as the kernel's attributes name them.
struct ThreadState {
    uint3_ tid;        // thread_position_in_threadgroup
    uint32_t tidx;     // thread_index_in_threadgroup
    uint3_ tgid;       // threadgroup_position_in_grid
    uint3_ gid;        // thread_position_in_grid
    uint3_ ntg;        // threads_per_threadgroup
    uint3_ ngrid;      // threadgroups_per_grid
    uint32_t lane, sg, nsg;
    void* tg_mem[kMaxBuffers];
};

// Runs `body` for every thread of the dispatch.  Returns "" or the error.
const char* run(const Dispatch& d, const std::function<void(const ThreadState&)>& body);

// Called by the prelude: block until the whole threadgroup arrives (line: the call site).
void barrier(int line);
// A SIMD collective: the calling lane's 16-byte value goes in; once every live
// lane has arrived, `resolve` computes each lane's result in place.
using Resolve = void (*)(unsigned char (*slots)[16], const bool* live, int op, int arg);
void collective(unsigned char* value16, Resolve resolve, int op, int arg, int line);
const ThreadState& self();

}  // namespace msl
