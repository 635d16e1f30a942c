// Gemma 3: the decoder of decoder.cpp with q and k RMS-normed per head and rotated NeoX style, embeddings
// scaled by sqrt(n_embd), a norm after attention and after the FFN (sandwich norms), a GELU (tanh) gate,
// and five of every six layers local: a sliding window over the keys and their own RoPE base.  The GGUF's
// norm weights already hold gemma's "1 +".
#include <cmath>

#include "common/error.h"
#include "models/architecture.h"
#include "models/config.h"
#include "models/decoder.h"

namespace minfer {

namespace {
void configure(ModelConfig& c, const WeightStore& w) {
    const std::string p = c.arch + ".";
    c.rope_neox = true;
    c.qk_norm = true;
    c.post_norms = true;
    c.ffn_gelu = true;
    c.embd_scale = std::sqrt(float(c.n_embd));
    // Queries are scaled by 1/sqrt(head_dim), except in the 27B model (62 layers), whose reference
    // implementation scales by 1/sqrt(n_embd / n_head).
    c.attn_scale = c.n_layer == 62 ? 1.0f / std::sqrt(float(c.n_embd / c.n_head)) : 1.0f / std::sqrt(float(c.head_dim));
    c.swa_window = meta_int(w, p + "attention.sliding_window", 0, 0, 1 << 24);
    if (c.swa_window > 0) {
        c.swa_period = meta_int(w, p + "attention.sliding_window_pattern", 6, 1, 1 << 16);
        c.rope_base_local = float(meta_num(w, p + "rope.freq_base_swa", 10000.0));
    }
    c.final_softcap = float(meta_num(w, p + "final_logit_softcapping", 0.0));
    if (!(c.final_softcap >= 0.0f))
        throw ModelError(strfmt("model '%s': final_logit_softcapping %g is negative", w.gguf().paths()[0].c_str(),
                                double(c.final_softcap)));
}
}  // namespace

extern const Architecture kGemma3{"gemma3", configure, build_decoder_graph};

}  // namespace minfer
