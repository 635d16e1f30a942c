// Hyperparameters of the decoder-only architectures minfer runs (models/architectures.cpp lists them), read
// from GGUF metadata and checked against the tensors.
#pragma once
#include <string>

#include "gguf/gguf.h"
#include "models/architecture.h"
#include "runtime/weights.h"

namespace minfer {

struct ModelConfig {
    std::string arch;            // general.architecture
    const Architecture* architecture = nullptr;  // its reader and graph
    int n_layer = 0, n_embd = 0, n_ff = 0;
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    int n_vocab = 0, n_ctx_train = 0;
    float eps = 1e-6f;
    float rope_base = 10000.0f;
    float rope_scale = 1.0f;     // linear RoPE scaling: 1 / rope.scaling.factor (global layers only)
    int rope_dim = 0;
    // Set by the architecture (models/<arch>.cpp):
    bool rope_neox = false;      // rotate halves (qwen2/qwen3), else adjacent pairs (llama)
    bool qkv_bias = false;       // q, k, v have biases (qwen2)
    bool qk_norm = false;        // q and k are RMS-normed per head (qwen3)
    float attn_scale = 0.0f;     // the scores' scale (0: 1 / sqrt(head_dim))
    float embd_scale = 0.0f;     // embeddings times this (gemma: sqrt(n_embd); 0: unscaled)
    bool post_norms = false;     // RMSNorm of the attention and FFN outputs before their residual adds (gemma)
    bool ffn_gelu = false;       // the FFN's gate is GELU (tanh form), else SiLU
    int swa_window = 0;          // local layers attend to this many positions (0: every layer is global)
    int swa_period = 0;          // layer l is local when l % swa_period < swa_period - 1 (gemma 3: 6)
    float rope_base_local = 10000.0f;  // local layers' RoPE base
    float final_softcap = 0.0f;  // logits = cap * tanh(logits / cap) (0: none)
    std::string output_weight;   // "output.weight", or "token_embd.weight" when tied

    // Reads and validates; a MinferError names the key or tensor that is wrong.
    static ModelConfig from_gguf(const WeightStore& weights);
    std::string layer_weight(int layer, const char* name) const;  // "blk.{layer}.{name}"
    bool is_local(int layer) const { return swa_window > 0 && layer % swa_period < swa_period - 1; }
    // A local layer's KV ring for a context of n_ctx: its window, plus the rows of one step (a step of at most
    // kRingStep rows stores its keys before reading the window behind them), rounded up to 32; 0 where the
    // ring would not be smaller than the context (or the layer is global).  A sequence may go back (rewind)
    // at most kRingStep positions from the furthest one written.
    static constexpr int kRingStep = 512;
    int kv_ring(int layer, int n_ctx) const {
        const int rows = (swa_window + kRingStep + 31) / 32 * 32;
        return is_local(layer) && rows < n_ctx ? rows : 0;
    }
    // The graph of a step of this model (its architecture's).
    Graph graph(const GraphParams& params) const { return architecture->graph(*this, params); }
};

// A numeric metadata value (`fallback` when absent; NaN: required), and one that must be an integer in
// [lo, hi]; a ModelError names the key.  For the architectures' configure (models/<arch>.cpp).
double meta_num(const WeightStore& w, const std::string& key, double fallback);
int meta_int(const WeightStore& w, const std::string& key, double fallback, int lo, int hi);

}  // namespace minfer
