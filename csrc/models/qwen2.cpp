// Qwen2 / Qwen2.5: the decoder of decoder.cpp with biases on q, k and v, rotating halves (NeoX).
#include "models/architecture.h"
#include "models/config.h"
#include "models/decoder.h"

namespace minfer {

namespace {
void configure(ModelConfig& c, const WeightStore&) {
    c.rope_neox = true;
    c.qkv_bias = true;
}
}  // namespace

extern const Architecture kQwen2{"qwen2", configure, build_decoder_graph};

}  // namespace minfer
