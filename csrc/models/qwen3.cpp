// Qwen3: the decoder of decoder.cpp with an RMSNorm on each head of q and k before the rotation (NeoX), no biases.
#include "models/architecture.h"
#include "models/config.h"
#include "models/decoder.h"

namespace minfer {

namespace {
void configure(ModelConfig& c, const WeightStore&) {
    c.rope_neox = true;
    c.qk_norm = true;
}
}  // namespace

extern const Architecture kQwen3{"qwen3", configure, build_decoder_graph};

}  // namespace minfer
