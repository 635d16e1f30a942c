// The emulator's scheduler: fibers (ucontext) for the threads of a
// threadgroup, barriers and SIMD collectives as the only switch points.
// See msl_runtime.h.  Under AddressSanitizer the fiber switches are announced
// to it (__sanitizer_start/finish_switch_fiber) so stack checks stay valid.
#include "msl_runtime.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define MSL_ASAN 1
#include <sanitizer/common_interface_defs.h>
#endif

namespace msl {

namespace {

constexpr size_t kStack = 256 * 1024;

enum class State { Ready, Barrier, Collective, Done };

struct Fiber {
    ucontext_t ctx;
    State state = State::Ready;
    int line = 0;                 // call site of the barrier / collective it waits at
    unsigned char slot[16];       // its value going into a collective (and the result coming out)
    Resolve resolve = nullptr;
    int op = 0, arg = 0;
    ThreadState ts;
};

struct Group {
    std::vector<Fiber> fibers;
    std::vector<std::unique_ptr<char[]>> stacks;
    ucontext_t sched;
    Fiber* current = nullptr;
    const std::function<void(const ThreadState&)>* body = nullptr;
    std::string error;
#ifdef MSL_ASAN
    const void* sched_bottom = nullptr;
    size_t sched_size = 0;
#endif
};

thread_local Group* g_group = nullptr;

void fail(const std::string& msg) {
    if (g_group->error.empty()) g_group->error = msg;
}

// Fiber -> scheduler.
void yield_to_scheduler(bool dying) {
    Group& g = *g_group;
#ifdef MSL_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(dying ? nullptr : &fake, g.sched_bottom, g.sched_size);
    swapcontext(&g.current->ctx, &g.sched);
    __sanitizer_finish_switch_fiber(fake, &g.sched_bottom, &g.sched_size);
#else
    (void)dying;
    swapcontext(&g.current->ctx, &g.sched);
#endif
}

void fiber_main() {
    Group& g = *g_group;
#ifdef MSL_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g.sched_bottom, &g.sched_size);
#endif
    Fiber* f = g.current;
    (*g.body)(f->ts);
    f->state = State::Done;
    yield_to_scheduler(true);
}

// Scheduler -> fiber.
void resume(Group& g, Fiber& f, size_t stack_index) {
    g.current = &f;
#ifdef MSL_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, g.stacks[stack_index].get(), kStack);
    swapcontext(&g.sched, &f.ctx);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    (void)stack_index;
    swapcontext(&g.sched, &f.ctx);
#endif
}

// Runs one threadgroup to completion (or to an error).
void run_group(Group& g, const Dispatch& d, uint3_ tgid, std::mt19937_64& rng) {
    const uint32_t nt = d.tg.x * d.tg.y * d.tg.z;
    const uint32_t nsg = (nt + kSimdWidth - 1) / kSimdWidth;
    std::vector<std::unique_ptr<unsigned char[]>> tg_mem;
    void* tg_ptrs[kMaxBuffers] = {};
    for (int i = 0; i < kMaxBuffers; i++)
        if (d.tg_bytes[i]) {
            tg_mem.emplace_back(new unsigned char[d.tg_bytes[i]]);
            std::memset(tg_mem.back().get(), 0xff, d.tg_bytes[i]);  // NaN for floats: unwritten reads show
            tg_ptrs[i] = tg_mem.back().get();
        }
    g.fibers.assign(nt, Fiber{});
    while (g.stacks.size() < nt) g.stacks.emplace_back(new char[kStack]);
    for (uint32_t i = 0; i < nt; i++) {
        Fiber& f = g.fibers[i];
        ThreadState& t = f.ts;
        t.tid = {i % d.tg.x, (i / d.tg.x) % d.tg.y, i / (d.tg.x * d.tg.y)};
        t.tidx = i;
        t.tgid = tgid;
        t.gid = {tgid.x * d.tg.x + t.tid.x, tgid.y * d.tg.y + t.tid.y, tgid.z * d.tg.z + t.tid.z};
        t.ntg = d.tg;
        t.ngrid = d.grid;
        t.lane = i % kSimdWidth;
        t.sg = i / kSimdWidth;
        t.nsg = nsg;
        std::memcpy(t.tg_mem, tg_ptrs, sizeof(tg_ptrs));
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g.stacks[i].get();
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = &g.sched;
        makecontext(&f.ctx, fiber_main, 0);
    }
    std::vector<uint32_t> order;
    for (;;) {
        // Run every ready fiber, in a random order, until it blocks or finishes.
        order.clear();
        for (uint32_t i = 0; i < nt; i++)
            if (g.fibers[i].state == State::Ready) order.push_back(i);
        std::shuffle(order.begin(), order.end(), rng);
        for (uint32_t i : order) {
            resume(g, g.fibers[i], i);
            if (!g.error.empty()) return;
        }
        // Release what can be released.
        bool progress = false, all_done = true;
        for (uint32_t s = 0; s < nsg; s++) {  // collectives: every live lane of the simdgroup is waiting
            const uint32_t a = s * kSimdWidth, b = std::min(nt, a + kSimdWidth);
            bool any = false, all_waiting = true;
            int line = 0;
            for (uint32_t i = a; i < b; i++) {
                const Fiber& f = g.fibers[i];
                if (f.state == State::Done) continue;
                if (f.state != State::Collective) all_waiting = false;
                else if (!any) any = true, line = f.line;
                else if (f.line != line) {
                    fail("lanes of simdgroup " + std::to_string(s) + " wait at different SIMD collectives (lines " +
                         std::to_string(line) + " and " + std::to_string(f.line) + ")");
                    return;
                }
            }
            if (!any || !all_waiting) continue;
            unsigned char slots[kSimdWidth][16];
            bool live[kSimdWidth] = {};
            const Fiber* first = nullptr;
            for (uint32_t i = a; i < b; i++)
                if (g.fibers[i].state == State::Collective) {
                    live[i - a] = true;
                    std::memcpy(slots[i - a], g.fibers[i].slot, 16);
                    if (!first) first = &g.fibers[i];
                }
            first->resolve(slots, live, first->op, first->arg);
            for (uint32_t i = a; i < b; i++)
                if (live[i - a]) {
                    std::memcpy(g.fibers[i].slot, slots[i - a], 16);
                    g.fibers[i].state = State::Ready;
                }
            progress = true;
        }
        int bline = -1;
        bool barrier_all = true, any_barrier = false;
        for (const Fiber& f : g.fibers) {
            if (f.state != State::Done) all_done = false;
            if (f.state == State::Barrier) {
                any_barrier = true;
                if (bline < 0) bline = f.line;
                else if (f.line != bline) {
                    fail("threads wait at different threadgroup barriers (lines " + std::to_string(bline) + " and " +
                         std::to_string(f.line) + "): a barrier in divergent control flow");
                    return;
                }
            } else if (f.state != State::Done) {
                barrier_all = false;
            }
        }
        if (all_done) {
            return;
        }
        if (any_barrier && barrier_all) {
            // Every thread still running is at this barrier; one that returned early never arrives.
            for (const Fiber& f : g.fibers)
                if (f.state == State::Done) {
                    fail("a thread returned before the barrier at line " + std::to_string(bline) +
                         " that the rest of its threadgroup waits at");
                    return;
                }
            for (Fiber& f : g.fibers)
                if (f.state == State::Barrier) f.state = State::Ready;
            progress = true;
        }
        if (!progress) {
            bool ready = false;
            for (const Fiber& f : g.fibers) ready = ready || f.state == State::Ready;
            if (!ready) {
                fail("deadlock: threads wait at a barrier while others wait at a SIMD collective");
                return;
            }
        }
    }
}

}  // namespace

const ThreadState& self() { return g_group->current->ts; }

void barrier(int line) {
    Fiber* f = g_group->current;
    f->state = State::Barrier;
    f->line = line;
    yield_to_scheduler(false);
}

void collective(unsigned char* value16, Resolve resolve, int op, int arg, int line) {
    Fiber* f = g_group->current;
    std::memcpy(f->slot, value16, 16);
    f->resolve = resolve;
    f->op = op;
    f->arg = arg;
    f->line = line;
    f->state = State::Collective;
    yield_to_scheduler(false);
    std::memcpy(value16, g_group->current->slot, 16);
}

const char* run(const Dispatch& d, const std::function<void(const ThreadState&)>& body) {
    static thread_local std::string error;
    error.clear();
    Group g;
    g.body = &body;
    Group* saved = g_group;
    g_group = &g;
    std::mt19937_64 rng(d.seed);
    for (uint32_t z = 0; z < d.grid.z && g.error.empty(); z++)
        for (uint32_t y = 0; y < d.grid.y && g.error.empty(); y++)
            for (uint32_t x = 0; x < d.grid.x && g.error.empty(); x++) run_group(g, d, uint3_{x, y, z}, rng);
    g_group = saved;
    error = g.error;
    return error.c_str();
}

}  // namespace msl
