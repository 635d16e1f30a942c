// An architecture minfer runs: what it reads from the GGUF beyond the hyperparameters every decoder has, and
// the graph of a step.  One file each (llama.cpp, qwen2.cpp, qwen3.cpp), one line each in architectures.cpp;
// README.md here says how to add one.
#pragma once
#include <string>

#include "graph/ir.h"
#include "runtime/weights.h"

namespace minfer {

struct ModelConfig;

struct Architecture {
    const char* name;  // general.architecture
    // Sets the architecture's own fields of `c` (its shared hyperparameters are read before); ModelError naming
    // a key that is wrong.  ModelConfig::from_gguf checks the tensors the fields say the graph reads, after.
    void (*configure)(ModelConfig& c, const WeightStore& w);
    Graph (*graph)(const ModelConfig& c, const GraphParams& params);
};

// The registered architecture of that name, or nullptr.
const Architecture* find_architecture(const std::string& name);
// Their names, comma-separated (for the error an unsupported architecture gets).
std::string architecture_names();

}  // namespace minfer
