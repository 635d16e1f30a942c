// The model's weights: views into the mmap'd GGUF, by tensor name.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace minfer {

struct Weight {
    std::string name;
    uint32_t type = 0;
    std::vector<int64_t> dims;   // GGUF order: dims[0] = columns (contiguous)
    const uint8_t* data = nullptr;
    size_t nbytes = 0;
    int64_t cols() const { return dims.empty() ? 0 : dims[0]; }
    int64_t rows() const {
        int64_t r = 1;
        for (size_t i = 1; i < dims.size(); i++) r *= dims[i];
        return r;
    }
};

class WeightStore {
  public:
    explicit WeightStore(std::shared_ptr<GGUF> gguf);
    bool has(const std::string& name) const { return weights_.count(name) != 0; }
    const Weight& get(const std::string& name) const;  // MinferError naming the tensor if missing
    const std::map<std::string, Weight>& all() const { return weights_; }
    size_t total_bytes() const {
        size_t n = 0;
        for (const auto& [name, w] : weights_) n += w.nbytes;
        return n;
    }
    const GGUF& gguf() const { return *gguf_; }

  private:
    std::shared_ptr<GGUF> gguf_;  // keeps the mapping alive
    std::map<std::string, Weight> weights_;
};

}  // namespace minfer
