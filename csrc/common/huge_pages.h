// Asking for 2 MB pages on a mapped range: a request to Linux's transparent
// huge pages ("madvise" or "always" mode); elsewhere, or refused, the range
// keeps 4 KB pages and everything still works.
#pragma once
#include <cstddef>

#include <sys/mman.h>

namespace minfer {

static inline void advise_huge_pages(void* p, size_t n) {
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

}  // namespace minfer
