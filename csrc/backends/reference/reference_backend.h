// The reference backend: every op of the IR in plain scalar C++ with float64
// arithmetic, single-threaded.  It is the oracle for the CPU backend's op tests
// and, assigned to every other run of nodes, exercises the scheduler's splits,
// syncs and cross-backend copies on a machine without a GPU.  It implements no
// fused ops.  Its MatMul quantizes the activations exactly as the CPU backend
// does (vec_dot_type) and then computes in float64, so the two differ only by
// float rounding.
#pragma once
#include "backends/host_backend.h"

namespace minfer {

class ReferenceBackend : public HostBackend {
  public:
    explicit ReferenceBackend(const WeightStore* weights) : HostBackend(weights) {}
    const char* name() const override { return "reference"; }
    bool supports_op(const Node& node) const override;
    bool supports_fused(Op) const override { return false; }
    void execute_node(const Node& node, const ExecArgs& args) override;
};

}  // namespace minfer
