// The graph builder for llama / qwen2 / qwen3: a prompt of n tokens is one
// graph; a decode step is the same graph with n = 1.
#pragma once
#include "graph/ir.h"
#include "models/config.h"

namespace minfer {

Graph build_decoder_graph(const ModelConfig& c, const GraphParams& params);

}  // namespace minfer
