// A read-only memory mapping of a whole file.  The GGUF reader and every weight
// view point into it; it is never written (PROT_READ), and it stays mapped as
// long as any shared_ptr to it lives (numpy views included).
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

  private:
    MappedFile() = default;
    std::string path_;
    std::vector<uint8_t> owned_;  // from_memory only
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace minfer
