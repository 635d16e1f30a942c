// A read-only memory mapping of a whole file (or, with MINFER_HUGEPAGES=1, a
// read-only copy of it in 2 MB pages: mapped_file.cpp).  The GGUF reader and every weight
// view point into it; it is never written (PROT_READ), and it stays mapped as
// long as any shared_ptr to it lives (numpy views included).
//
// A file truncated by another process turns reads of the lost pages into
// SIGBUS, which no library can recover from safely inside a computation.  So
// the descriptor stays open and check_unchanged() compares the file's size and
// modification time with those at open: callers run it at safe points (before
// each evaluation) and get a GGUFError instead of a crash or silently
// different weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace minfer {

class MappedFile {
  public:
    static std::shared_ptr<MappedFile> open(const std::string& path);  // throws GGUFError
    // A copy of `size` bytes held in memory, named `name` in messages (fuzzing, tests).
    static std::shared_ptr<MappedFile> from_memory(const std::string& name, const uint8_t* data, size_t size);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    // Throws GGUFError if the file was truncated, extended or rewritten since open.
    void check_unchanged() const;

  private:
    MappedFile() = default;
    std::string path_;
    std::vector<uint8_t> owned_;  // from_memory only
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    size_t map_size_ = 0;       // MINFER_HUGEPAGES copies only: the anonymous mapping's length
    int fd_ = -1;               // open() only
    int64_t mtime_ns_ = 0;
};

}  // namespace minfer
