// The buffer pool shared by the backends whose memory is host memory (CPU and
// reference): buffers are zeroed f32 arrays, read/write_host are memcpys, and
// synchronize has nothing to wait for (execute_node runs to completion).
#pragma once
#include <cstdlib>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "runtime/weights.h"

namespace minfer {

// The k best of the n floats at x (top_k's order), their values beside them; a NaN among them is an error.
void best_of_row(const float* x, size_t n, int k, float* vals, int32_t* ids);
// Row x's greedy token (the first of equal maxima) among those allow permits (nullptr: all); a NaN an error.
int argmax_of_row(const float* x, size_t n, const uint32_t* allow);

class HostBackend : public Backend {
  public:
    explicit HostBackend(const WeightStore* weights) : weights_(weights) {}
    bool has_weight(const std::string& name) const override { return weights_ && weights_->has(name); }

    int alloc_buffer(size_t n_floats) override;
    void free_buffer(int id) override;
    int alloc_fresh(size_t n_floats) override;
    int alloc_kv(size_t bytes) override;
    size_t buffer_size(int id) const override;
    void read_host(int id, size_t offset, float* dst, size_t n) override;
    void write_host(int id, size_t offset, const float* src, size_t n) override;
    void synchronize() override {}

  protected:
    float* ptr(int id);
    float* at(const BufRef& b) { return ptr(b.id) + b.offset; }
    const Weight& weight(const std::string& name) const { return weights_->get(name); }
    const WeightStore* weights_;

  private:
    // calloc'd, so that the pages of a long context's KV region are taken as positions fill them, not up front.
    struct Buffer {
        std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
        size_t size = 0;
    };
    std::vector<Buffer> pool_;
    std::vector<int> free_;
};

}  // namespace minfer
