// Passes over a built graph, in the order the engine runs them:
// assign_backends, then fuse.
#pragma once
#include <string>
#include <vector>

#include "backends/backend.h"
#include "graph/ir.h"

namespace minfer {

struct BackendSlot {
    Backend* backend;
    bool participates;   // GPU backends: the all-weights-registered gate passed
    bool auto_assign;    // false for the reference backend (only forced patterns use it)
};

// Each node goes to the first participating backend (in list order, which is
// the priority Metal -> CUDA -> CPU) whose supports_op says yes.  A pattern
// "alternate:K" instead alternates between the backends named "cpu" and
// "reference" every K nodes (tests of splits).  Attn always joins its layer's
// KvStore (the KV cache lives on one backend).  No backend => MinferError.
void assign_backends(Graph& g, const std::vector<BackendSlot>& slots, const std::string& pattern);

// Rewrites Mul(Silu(a), b) -> SwiGLU, gate/up MatMuls + SwiGLU -> FusedFFN,
// q/k/v MatMuls -> FusedQKV (+ the QkNorms -> FusedQkvNorm), the q and k
// Ropes with the KvStore -> RopeKvStore (and that with the FusedQKV it reads
// -> FusedQkvRope), a residual Add and the RmsNorm of
// its sum -> AddRmsNorm (both results as column windows), each only where
// all the nodes involved sit on one backend whose supports_fused says yes.
// Returns the number of rewrites.
int fuse(Graph& g, const std::vector<BackendSlot>& slots);

}  // namespace minfer
