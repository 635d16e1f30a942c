// Conversions the engine bindings (bind_engine.cpp, bind_scheduler.cpp) share.
#pragma once
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "engine/scheduler.h"
#include "graph/ir.h"

namespace minfer {

uint32_t kv_type_from(const std::string& s);           // "f16" | "f32" | "q8_0"
Op op_from(const std::string& s);                      // an op's name; ValueError for others
void meta_from(NodeMeta& m, const pybind11::dict& d);  // ValueError for an unknown key
pybind11::dict node_dict(const Node& n);
// The options a Scheduler or Session is made with from Python (kv_type by name).
SchedulerOptions scheduler_options(int n_ctx, int threads, const std::string& kv_type, const std::string& isa,
                                   const std::string& device, bool fuse);
// Node inputs from indices or (node, first column, columns) tuples, each naming one of the n_before earlier nodes.
std::vector<NodeInput> inputs_from(const pybind11::list& inputs, int n_before);

}  // namespace minfer
