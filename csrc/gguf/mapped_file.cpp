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
    ::close(fd);  // the mapping keeps the file alive
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
}

}  // namespace minfer
