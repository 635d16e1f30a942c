#include "gguf/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

namespace minfer {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
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
    if (f->size_ > 0) {
        void* p = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
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
    if (data_ && owned_.empty()) munmap((void*)data_, size_);
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
