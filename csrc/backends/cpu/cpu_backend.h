// The CPU backend: the SIMD kernels of quant/ and backends/cpu/ behind the
// Backend contract, multithreaded on one shared pool.
#pragma once
#include <memory>

#include "backends/host_backend.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"

namespace minfer {

class CpuBackend : public HostBackend {
  public:
    CpuBackend(const WeightStore* weights, std::shared_ptr<ThreadPool> pool, Isa isa);
    const char* name() const override { return "cpu"; }
    bool supports_op(const Node& node) const override;
    bool supports_fused(Op fused) const override;
    void execute_node(const Node& node, const ExecArgs& args) override;
    // The rows in place, spread over the pool's threads.
    void top_k_rows(int id, size_t offset, size_t n, int rows, size_t ld, int k, float* vals, int32_t* ids) override;
    void argmax_rows(int id, size_t offset, size_t n, int rows, size_t ld, int32_t* out,
                     const uint32_t* allow = nullptr) override;
    ThreadPool& pool() { return *pool_; }
    Isa isa() const { return kernels_->isa; }

  private:
    void qkv(const Node& node, const ExecArgs& args);
    void ffn(const Node& node, const ExecArgs& args);
    void add_bias(const std::string& bias, float* y, int64_t ld, int64_t rows, int64_t cols);
    std::shared_ptr<ThreadPool> pool_;
    const DotKernels* kernels_;
    std::vector<float> scratch_;
};

}  // namespace minfer
