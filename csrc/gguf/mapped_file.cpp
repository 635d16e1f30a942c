#include "gguf/mapped_file.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/settings.h"
#include "common/huge_pages.h"

namespace minfer {

namespace {

// MINFER_HUGEPAGES=1: the file's bytes are copied into anonymous memory the kernel is asked to back with 2 MB
// pages (MADV_HUGEPAGE; transparent huge pages in "madvise" or "always" mode) instead of being mapped from the
// page cache in 4 KB pages.  Decode streams every weight once a token, and with 4 KB pages each page is a TLB
// walk and a stop for the hardware prefetcher, so CPU decode runs faster from 2 MB pages.  The price: a copy at load (a second resident copy while the
// page cache keeps the file) and its time.  Where the kernel gives no huge pages the copy still works.
bool huge_pages_requested() { return setting_bool("MINFER_HUGEPAGES"); }

constexpr size_t kHugePage = size_t(2) << 20;

// The file mapped read-only at a 2 MB-aligned address (file offset 0 there, so each 2 MB of the file lines up
// with one huge-page table entry), with MADV_HUGEPAGE.  Where the page cache holds the file in 2 MB folios
// -- Linux 6.x reads files on ext4 / xfs cold into large folios, up to 2 MB ones (measured: 438 of 480 MB of
// a model read cold) -- the kernel maps each 2 MB with one entry: one TLB entry instead of 512 and no prefetcher stop
// every 4 KB, the huge-page copy's gain without a copy.  Where the cache holds 4 KB pages (e.g. a file just written), it maps those as before.
void* map_aligned(int fd, size_t size) {
    const size_t span = size + kHugePage;
    void* r = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return MAP_FAILED;
    const uintptr_t lo = uintptr_t(r), a = (lo + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
    void* p = mmap((void*)a, size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        munmap(r, span);
        errno = err;
        return MAP_FAILED;
    }
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t end = (a + size + page - 1) & ~(page - 1);  // the file mapping's last page ends here
    if (a > lo) munmap(r, a - lo);                               // the reservation's slack either side
    if (lo + span > end) munmap((void*)end, lo + span - end);
    advise_huge_pages(p, size);
    return p;
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
    const bool copy = huge_pages_requested();  // before the descriptor exists: a bad value leaks nothing
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw GGUFError(strfmt("cannot open GGUF file '%s': %s", path.c_str(), std::strerror(errno)));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw GGUFError(strfmt("GGUF file '%s' is not a regular file", path.c_str()));
    }
    std::shared_ptr<MappedFile> f(new MappedFile());
    f->path_ = path;
    f->size_ = size_t(st.st_size);
    f->fd_ = -1;
    if (copy && f->size_ > 0) {
        f->map_size_ = (f->size_ + kHugePage - 1) / kHugePage * kHugePage;
        void* p = mmap(nullptr, f->map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            throw OutOfMemoryError(strfmt("MINFER_HUGEPAGES: cannot allocate %zu bytes for a copy of '%s': %s",
                                          f->map_size_, path.c_str(), std::strerror(err)));
        }
        advise_huge_pages(p, f->map_size_);  // without huge pages the copy still works
        f->data_ = (const uint8_t*)p;  // owned from here: ~MappedFile unmaps it
        size_t done = 0;
        while (done < f->size_) {
            const ssize_t n = pread(fd, (uint8_t*)p + done, f->size_ - done, off_t(done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                int err = n < 0 ? errno : 0;
                ::close(fd);
                throw GGUFError(strfmt("GGUF file '%s': read %zu of %zu bytes%s%s", path.c_str(), done, f->size_,
                                       err ? ": " : " (the file shrank while being read)", err ? std::strerror(err) : ""));
            }
            done += size_t(n);
        }
        mprotect(p, f->map_size_, PROT_READ);
    } else if (f->size_ > 0) {
        void* p = map_aligned(fd, f->size_);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            throw GGUFError(strfmt("cannot mmap GGUF file '%s' (%zu bytes): %s", path.c_str(), f->size_,
                                   std::strerror(err)));
        }
        f->data_ = (const uint8_t*)p;
    }
    f->fd_ = fd;  // kept for check_unchanged()
    f->mtime_ns_ = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    return f;
}

std::shared_ptr<MappedFile> MappedFile::from_memory(const std::string& name, const uint8_t* data, size_t size) {
    std::shared_ptr<MappedFile> f(new MappedFile());
    f->path_ = name;
    f->owned_.assign(data, data + size);
    f->data_ = f->owned_.empty() ? nullptr : f->owned_.data();
    f->size_ = size;
    return f;
}

MappedFile::~MappedFile() {
    if (data_ && owned_.empty()) munmap((void*)data_, map_size_ ? map_size_ : size_);
    if (fd_ >= 0) ::close(fd_);
}

void MappedFile::check_unchanged() const {
    if (fd_ < 0) return;
    struct stat st;
    if (fstat(fd_, &st) != 0)
        throw GGUFError(strfmt("GGUF file '%s' can no longer be inspected: %s", path_.c_str(), std::strerror(errno)));
    if (size_t(st.st_size) != size_)
        throw GGUFError(strfmt("GGUF file '%s' changed size while in use (%zu bytes at open, now %lld): it was "
                               "truncated or rewritten by another process; reopen the model",
                               path_.c_str(), size_, (long long)st.st_size));
    int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (mtime != mtime_ns_)
        throw GGUFError(strfmt("GGUF file '%s' was modified while in use (its weights may have changed); reopen the model",
                               path_.c_str()));
}

}  // namespace minfer
