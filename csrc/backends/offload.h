// What the settings tell every GPU backend: the ops it leaves to the CPU (MINFER_CPU_OPS, for mixed
// graphs) and how long it may wait for its device (MINFER_GPU_TIMEOUT_S).
#pragma once
#include <set>

#include "graph/ir.h"

namespace minfer {

// The ops named in MINFER_CPU_OPS; MinferError "MINFER_CPU_OPS='X': unknown op 'X'" for a name that is no op.
std::set<Op> cpu_ops_setting();

// MINFER_GPU_TIMEOUT_S in seconds.
double gpu_timeout_s();

}  // namespace minfer
