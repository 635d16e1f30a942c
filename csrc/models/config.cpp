#include "models/config.h"

#include <cmath>

#include "common/error.h"
#include "quant/quant.h"

namespace minfer {

namespace {

const std::string& path_of(const WeightStore& w) { return w.gguf().paths()[0]; }

void expect_shape(const WeightStore& w, const std::string& name, int64_t cols, int64_t rows) {
    const Weight& t = w.get(name);
    if (t.cols() != cols || t.rows() != rows || t.dims.size() > 2)
        throw ModelError(strfmt("model '%s': tensor '%s' has shape [%lld, %lld], expected [%lld, %lld] (GGUF order)",
                                 path_of(w).c_str(), name.c_str(), (long long)t.cols(), (long long)t.rows(),
                                 (long long)cols, (long long)rows));
}

void expect_f32_vector(const WeightStore& w, const std::string& name, int64_t n) {
    expect_shape(w, name, n, 1);
    if (w.get(name).type != GGML_TYPE_F32)
        throw ModelError(strfmt("model '%s': tensor '%s' is %s; norms and biases must be F32", path_of(w).c_str(),
                                 name.c_str(), type_traits(w.get(name).type).name));
}

void expect_matrix(const WeightStore& w, const std::string& name, int64_t cols, int64_t rows) {
    expect_shape(w, name, cols, rows);
    uint32_t t = w.get(name).type;
    if (!dot_kernels_scalar()->dot[t])
        throw ModelError(strfmt("model '%s': tensor '%s' has type %s, which minfer cannot multiply", path_of(w).c_str(),
                                 name.c_str(), type_traits(t).name));
}

}  // namespace

double meta_num(const WeightStore& w, const std::string& key, double fallback) {
    const GGUFValue* v = w.gguf().find(key);
    if (!v) {
        if (fallback != fallback)
            throw ModelError(strfmt("model '%s' lacks the metadata key '%s'", path_of(w).c_str(), key.c_str()));
        return fallback;
    }
    switch (v->type) {
        case GGUFType::UINT8: case GGUFType::UINT16: case GGUFType::UINT32: case GGUFType::UINT64: return double(v->u);
        case GGUFType::INT8: case GGUFType::INT16: case GGUFType::INT32: case GGUFType::INT64: return double(v->i);
        case GGUFType::FLOAT32: case GGUFType::FLOAT64: return v->f;
        default:
            throw ModelError(strfmt("model '%s': metadata '%s' has type %s, expected a number", path_of(w).c_str(),
                                     key.c_str(), gguf_type_name(v->type)));
    }
}

int meta_int(const WeightStore& w, const std::string& key, double fallback, int lo, int hi) {
    double v = meta_num(w, key, fallback);
    if (!(v >= lo && v <= hi) || v != double(int64_t(v)))
        throw ModelError(strfmt("model '%s': metadata '%s' = %g is not an integer in [%d, %d]", path_of(w).c_str(),
                                 key.c_str(), v, lo, hi));
    return int(v);
}

std::string ModelConfig::layer_weight(int layer, const char* name) const {
    return "blk." + std::to_string(layer) + "." + name;
}

ModelConfig ModelConfig::from_gguf(const WeightStore& w) {
    ModelConfig c;
    const GGUFValue* a = w.gguf().find("general.architecture");
    if (!a || a->type != GGUFType::STRING)
        throw ModelError(strfmt("model '%s' has no general.architecture string", path_of(w).c_str()));
    c.arch = std::string(a->str);
    c.architecture = find_architecture(c.arch);
    if (!c.architecture)
        throw ModelError(strfmt("model '%s': architecture '%s' is not supported (%s)", path_of(w).c_str(),
                                 c.arch.c_str(), architecture_names().c_str()));
    const std::string p = c.arch + ".";
    const double req = 0.0 / 0.0;
    c.n_layer = meta_int(w, p + "block_count", req, 1, 1024);
    c.n_embd = meta_int(w, p + "embedding_length", req, 1, 1 << 20);
    c.n_ff = meta_int(w, p + "feed_forward_length", req, 1, 1 << 22);
    c.n_head = meta_int(w, p + "attention.head_count", req, 1, 4096);
    c.n_head_kv = meta_int(w, p + "attention.head_count_kv", c.n_head, 1, c.n_head);
    if (c.n_head % c.n_head_kv != 0)
        throw ModelError(strfmt("model '%s': %d attention heads is not a multiple of %d KV heads", path_of(w).c_str(),
                                 c.n_head, c.n_head_kv));
    c.head_dim = meta_int(w, p + "attention.key_length", c.n_embd / c.n_head, 2, 1 << 14);
    int vlen = meta_int(w, p + "attention.value_length", c.head_dim, 2, 1 << 14);
    if (vlen != c.head_dim)
        throw ModelError(strfmt("model '%s': key length %d != value length %d is not supported", path_of(w).c_str(),
                                 c.head_dim, vlen));
    c.eps = float(meta_num(w, p + "attention.layer_norm_rms_epsilon", req));
    c.rope_base = float(meta_num(w, p + "rope.freq_base", 10000.0));
    c.rope_dim = meta_int(w, p + "rope.dimension_count", c.head_dim, 2, c.head_dim);
    if (c.rope_dim % 2) throw ModelError(strfmt("model '%s': odd rope dimension %d", path_of(w).c_str(), c.rope_dim));
    c.n_ctx_train = meta_int(w, p + "context_length", 4096, 1, 1 << 24);
    // RoPE scaling: none, or linear (positions divided by the factor); llama.cpp's default type is linear, so a
    // factor without a type scales too.  YaRN and the others are refused by name.
    const GGUFValue* st = w.gguf().find(p + "rope.scaling.type");
    const bool named = st && st->type == GGUFType::STRING;
    if (named && st->str != "none" && st->str != "linear")
        throw ModelError(strfmt("model '%s': rope scaling '%.*s' is not supported (only linear is)", path_of(w).c_str(),
                                 int(st->str.size()), st->str.data()));
    if (!named || st->str == "linear") {
        double factor = meta_num(w, p + "rope.scaling.factor", 0.0);
        if (factor == 0.0) factor = meta_num(w, p + "rope.scale_linear", 0.0);  // the older key
        if (!(factor >= 0.0) || !std::isfinite(factor))
            throw ModelError(strfmt("model '%s': rope scaling factor %g is not a positive number", path_of(w).c_str(), factor));
        if (factor > 0.0) c.rope_scale = float(1.0 / factor);
    }
    c.architecture->configure(c, w);

    // Tensors: every one the graph reads, with its shape.
    const Weight& emb = w.get("token_embd.weight");
    c.n_vocab = int(emb.rows());
    expect_shape(w, "token_embd.weight", c.n_embd, c.n_vocab);
    c.output_weight = w.has("output.weight") ? "output.weight" : "token_embd.weight";
    expect_matrix(w, c.output_weight, c.n_embd, c.n_vocab);
    expect_f32_vector(w, "output_norm.weight", c.n_embd);
    const int q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim;
    for (int l = 0; l < c.n_layer; l++) {
        expect_f32_vector(w, c.layer_weight(l, "attn_norm.weight"), c.n_embd);
        expect_matrix(w, c.layer_weight(l, "attn_q.weight"), c.n_embd, q);
        expect_matrix(w, c.layer_weight(l, "attn_k.weight"), c.n_embd, kv);
        expect_matrix(w, c.layer_weight(l, "attn_v.weight"), c.n_embd, kv);
        expect_matrix(w, c.layer_weight(l, "attn_output.weight"), q, c.n_embd);
        if (c.qkv_bias) {
            expect_f32_vector(w, c.layer_weight(l, "attn_q.bias"), q);
            expect_f32_vector(w, c.layer_weight(l, "attn_k.bias"), kv);
            expect_f32_vector(w, c.layer_weight(l, "attn_v.bias"), kv);
        }
        if (c.qk_norm) {
            expect_f32_vector(w, c.layer_weight(l, "attn_q_norm.weight"), c.head_dim);
            expect_f32_vector(w, c.layer_weight(l, "attn_k_norm.weight"), c.head_dim);
        }
        expect_f32_vector(w, c.layer_weight(l, "ffn_norm.weight"), c.n_embd);
        if (c.post_norms) {
            expect_f32_vector(w, c.layer_weight(l, "post_attention_norm.weight"), c.n_embd);
            expect_f32_vector(w, c.layer_weight(l, "post_ffw_norm.weight"), c.n_embd);
        }
        expect_matrix(w, c.layer_weight(l, "ffn_gate.weight"), c.n_embd, c.n_ff);
        expect_matrix(w, c.layer_weight(l, "ffn_up.weight"), c.n_embd, c.n_ff);
        expect_matrix(w, c.layer_weight(l, "ffn_down.weight"), c.n_ff, c.n_embd);
    }
    return c;
}

}  // namespace minfer
