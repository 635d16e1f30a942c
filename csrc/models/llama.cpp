// Llama (and SmolLM2, Mistral-style files): the decoder of decoder.cpp, rotating adjacent pairs.
#include "models/architecture.h"
#include "models/config.h"
#include "models/decoder.h"

namespace minfer {

namespace {
void configure(ModelConfig& c, const WeightStore&) { c.rope_neox = false; }
}  // namespace

extern const Architecture kLlama{"llama", configure, build_decoder_graph};

}  // namespace minfer
