// The llama-family decoder's graph (llama, qwen2 and qwen3 take it, their ModelConfig flags choosing biases,
// q/k norms and the rotation): a prompt of n tokens is one graph; a decode step is the same graph with n = 1.
#pragma once
#include "graph/ir.h"
#include "models/config.h"

namespace minfer {

Graph build_decoder_graph(const ModelConfig& c, const GraphParams& params);

}  // namespace minfer
