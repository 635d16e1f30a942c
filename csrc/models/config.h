// Hyperparameters of the decoder-only architectures minfer runs (llama, qwen2,
// qwen3), read from GGUF metadata and checked against the tensors.
#pragma once
#include <string>

#include "gguf/gguf.h"
#include "runtime/weights.h"

namespace minfer {

struct ModelConfig {
    std::string arch;            // "llama" | "qwen2" | "qwen3"
    int n_layer = 0, n_embd = 0, n_ff = 0;
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    int n_vocab = 0, n_ctx_train = 0;
    float eps = 1e-6f;
    float rope_base = 10000.0f;
    int rope_dim = 0;
    bool rope_neox = false;      // qwen2/qwen3 rotate halves; llama rotates adjacent pairs
    bool qkv_bias = false;       // qwen2
    bool qk_norm = false;        // qwen3
    std::string output_weight;   // "output.weight", or "token_embd.weight" when tied

    // Reads and validates; a MinferError names the key or tensor that is wrong.
    static ModelConfig from_gguf(const WeightStore& weights);
    std::string layer_weight(int layer, const char* name) const;  // "blk.{layer}.{name}"
};

}  // namespace minfer
