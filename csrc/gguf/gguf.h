// GGUF (v2, v3) reader over mmap, with split-model support.
//
// File layout (little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key, u32 value type, value)
//   n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset)
//   padding to `general.alignment` (default 32) | tensor data
// A string is u64 length + bytes; an array is u32 element type + u64 count +
// elements.  Everything is validated against the file size before use; any
// violation is a GGUFError naming the file, the field and the numbers.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/mapped_file.h"

namespace minfer {

enum class GGUFType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GGUFType t);

// One metadata value.  Strings and numeric arrays point into the mapping.
struct GGUFValue {
    GGUFType type = GGUFType::UINT8;
    uint64_t u = 0;          // unsigned integers and bool
    int64_t i = 0;           // signed integers
    double f = 0.0;          // floats
    std::string_view str;    // STRING
    // ARRAY
    GGUFType elem_type = GGUFType::UINT8;
    uint64_t count = 0;
    const uint8_t* elems = nullptr;        // numeric / bool arrays: raw elements
    std::vector<std::string_view> strs;    // string arrays
    std::vector<GGUFValue> items;          // arrays of arrays
};

struct GGUFTensor {
    std::string name;
    uint32_t type = 0;            // ggml type id
    std::vector<int64_t> dims;    // ne[0] (innermost, contiguous) first
    uint64_t offset = 0;          // within its file's data section
    uint64_t nbytes = 0;
    int file = 0;                 // which split file holds it
    const uint8_t* data = nullptr;
    int64_t n_elements() const;
};

class GGUF {
  public:
    // Opens a file; a name like `model-00001-of-00003.gguf` opens all the splits.
    static std::shared_ptr<GGUF> open(const std::string& path);
    // Parses a single (non-split) file held in memory.
    static std::shared_ptr<GGUF> from_memory(const std::string& name, const uint8_t* data, size_t size);

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    const std::vector<std::string>& paths() const { return paths_; }
    const std::vector<std::shared_ptr<MappedFile>>& files() const { return files_; }
    uint64_t data_offset(int file) const { return data_offsets_[size_t(file)]; }

    // Metadata of the first file, in file order.
    const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }
    const GGUFValue* find(const std::string& key) const;

    const std::vector<GGUFTensor>& tensors() const { return tensors_; }
    const GGUFTensor* find_tensor(const std::string& name) const;

  private:
    void parse_file(int index);
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    std::vector<std::string> paths_;
    std::vector<std::shared_ptr<MappedFile>> files_;
    std::vector<uint64_t> data_offsets_;
    std::vector<std::pair<std::string, GGUFValue>> kv_;
    std::map<std::string, size_t> kv_index_;
    std::vector<GGUFTensor> tensors_;
    std::map<std::string, size_t> tensor_index_;
};

}  // namespace minfer
