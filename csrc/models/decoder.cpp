// One layer, as the graph sees it (x: [n, n_embd] residual stream; [gemma] the flags models/gemma3.cpp sets):
//
//   [x = Scale(x), embeddings times sqrt(n_embd), before the first layer]
//   h = RmsNorm(x)                    attn_norm
//   q, k, v = MatMul(h) (+ bias)      attn_q/k/v          qwen2: biases
//   q, k = QkNorm(q), QkNorm(k)                           qwen3 only
//   q, k = Rope(q), Rope(k)           neox (qwen) or normal (llama) pairs; [local layers: their own base]
//   KvStore(k, v);  a = Attn(q)       causal GQA over the layer's cache [local layers: a sliding window]
//   x = x + MatMul(a)                 attn_output         [RmsNorm'd by post_attention_norm first]
//   [last layer, last-logits graphs: x = TailRow(x)]
//   [last layer, batch steps: x = PickRows(x, each sequence's last row)]
//   h = RmsNorm(x)                    ffn_norm
//   x = x + MatMul(Silu(MatMul(h)) * MatMul(h))           ffn_down(silu(gate) * up)  [gelu; post_ffw_norm]
//
// then logits = MatMul(RmsNorm(x)) with output_norm and output (or the tied
// embedding) [and SoftCap].  Fused ops are not emitted here: the fusion pass makes them
// where the assigned backend can run them.
//
// A batch step (params.n_seqs > 0) is the same graph over rows of several sequences, laid out sequence by
// sequence: KvStore writes at each token's pool row (the Slots input) and Attn reads each row's sequence
// through its block table (SeqIndex, BlockTables), so the matmuls see all the step's tokens at once.
#include "models/decoder.h"

#include <cmath>

namespace minfer {

namespace {

NodeInput full(int node) { return NodeInput{node, 0, -1}; }

struct Builder {
    Graph g;
    int rows;

    int node(Op op, std::vector<NodeInput> in, int r, int cols, NodeMeta m, std::string name) {
        Node n;
        n.op = op;
        n.in = std::move(in);
        n.rows = r;
        n.cols = cols;
        n.meta = std::move(m);
        n.name = std::move(name);
        return g.add(std::move(n));
    }
};

}  // namespace

Graph build_decoder_graph(const ModelConfig& c, const GraphParams& params) {
    Builder b;
    b.g.params = params;
    int n = params.n_tokens;
    const int q_cols = c.n_head * c.head_dim, kv_cols = c.n_head_kv * c.head_dim;

    NodeMeta mt;
    mt.input = InputKind::Tokens;
    int tokens = b.node(Op::Input, {}, n, 1, mt, "tokens");
    NodeMeta mp;
    mp.input = InputKind::Positions;
    int pos = b.node(Op::Input, {}, n, 1, mp, "positions");
    const bool batch = params.n_seqs > 0;
    int slots = pos, seq = -1, tables = -1, out_rows = -1, local_slots = -1, local_tables = -1;
    if (batch) {
        auto input = [&](InputKind kind, int rows, int cols, const char* name) {
            NodeMeta m;
            m.input = kind;
            return b.node(Op::Input, {}, rows, cols, m, name);
        };
        slots = input(InputKind::Slots, n, 1, "slots");
        seq = input(InputKind::SeqIndex, n, 1, "seq_index");
        tables = input(InputKind::BlockTables, params.n_seqs, params.max_blocks, "block_tables");
        if (params.n_ctx_local > 0) {  // the sliding-window layers' own pool
            local_slots = input(InputKind::LocalSlots, n, 1, "local_slots");
            local_tables = input(InputKind::LocalTables, params.n_seqs, params.max_blocks, "local_block_tables");
        }
        if (params.n_seqs < n) out_rows = input(InputKind::OutRows, params.n_seqs, 1, "out_rows");
    }

    NodeMeta me;
    me.weight = "token_embd.weight";
    int x = b.node(Op::GetRows, {full(tokens)}, n, c.n_embd, me, "token_embd");
    if (c.embd_scale != 0.0f) {
        NodeMeta ms;
        ms.scale = c.embd_scale;
        x = b.node(Op::Scale, {full(x)}, n, c.n_embd, ms, "token_embd_scale");
    }

    for (int l = 0; l < c.n_layer; l++) {
        const std::string L = "blk." + std::to_string(l) + ".";
        auto norm = [&](int in, const char* w, int rows) {
            NodeMeta m;
            m.layer = l;
            m.weight = L + w;
            m.eps = c.eps;
            return b.node(Op::RmsNorm, {full(in)}, rows, c.n_embd, m, L + w);
        };
        auto matmul = [&](int in, const std::string& w, const std::string& bias, int rows, int cols, Role role) {
            NodeMeta m;
            m.layer = l;
            m.weight = w;
            m.bias = bias;
            m.role = role;
            return b.node(Op::MatMul, {full(in)}, rows, cols, m, w.substr(0, w.size() - 7));  // drop ".weight"
        };
        int h = norm(x, "attn_norm.weight", n);
        int q = matmul(h, L + "attn_q.weight", c.qkv_bias ? L + "attn_q.bias" : "", n, q_cols, Role::Q);
        int k = matmul(h, L + "attn_k.weight", c.qkv_bias ? L + "attn_k.bias" : "", n, kv_cols, Role::K);
        int v = matmul(h, L + "attn_v.weight", c.qkv_bias ? L + "attn_v.bias" : "", n, kv_cols, Role::V);
        if (c.qk_norm) {
            NodeMeta m;
            m.layer = l;
            m.eps = c.eps;
            m.head_dim = c.head_dim;
            m.weight = L + "attn_q_norm.weight";
            q = b.node(Op::QkNorm, {full(q)}, n, q_cols, m, L + "attn_q_norm");
            m.weight = L + "attn_k_norm.weight";
            k = b.node(Op::QkNorm, {full(k)}, n, kv_cols, m, L + "attn_k_norm");
        }
        NodeMeta mr;
        mr.layer = l;
        mr.head_dim = c.head_dim;
        mr.rope_dim = c.rope_dim;
        mr.rope_base = c.is_local(l) ? c.rope_base_local : c.rope_base;
        mr.rope_scale = c.is_local(l) ? 1.0f : c.rope_scale;  // llama.cpp scales the global layers only
        mr.rope_neox = c.rope_neox;
        q = b.node(Op::Rope, {full(q), full(pos)}, n, q_cols, mr, L + "rope_q");
        k = b.node(Op::Rope, {full(k), full(pos)}, n, kv_cols, mr, L + "rope_k");

        NodeMeta ma;
        ma.layer = l;
        ma.n_head = c.n_head;
        ma.n_head_kv = c.n_head_kv;
        ma.head_dim = c.head_dim;
        ma.kv_type = params.kv_type;
        ma.n_ctx = params.n_ctx;
        const bool own_pool = batch && c.is_local(l) && params.n_ctx_local > 0;
        if (own_pool) ma.n_ctx = params.n_ctx_local;
        ma.attn_scale = c.attn_scale > 0.0f ? c.attn_scale : float(1.0 / std::sqrt(double(c.head_dim)));
        ma.window = c.is_local(l) ? c.swa_window : 0;
        if (batch) ma.block_size = params.block_size;  // KvStore and Attn over the paged pool
        else ma.kv_ring = c.kv_ring(l, params.n_ctx);  // one sequence: a local layer's ring
        int st = b.node(Op::KvStore, {full(k), full(v), full(own_pool ? local_slots : slots)}, n, 1, ma, L + "kv_store");
        std::vector<NodeInput> attn_in = {full(q), full(pos), full(st)};
        if (batch) {
            attn_in.push_back(full(seq));
            attn_in.push_back(full(own_pool ? local_tables : tables));
        }
        int att = b.node(Op::Attn, attn_in, n, q_cols, ma, L + "attn");
        int o = matmul(att, L + "attn_output.weight", "", n, c.n_embd, Role::None);
        if (c.post_norms) o = norm(o, "post_attention_norm.weight", n);
        NodeMeta m0;
        m0.layer = l;
        x = b.node(Op::Add, {full(x), full(o)}, n, c.n_embd, m0, L + "attn_residual");

        if (l == c.n_layer - 1 && out_rows >= 0) {
            // Only each sequence's last row goes on.
            x = b.node(Op::PickRows, {full(x), full(out_rows)}, params.n_seqs, c.n_embd, m0, "pick_rows");
            n = params.n_seqs;
        } else if (l == c.n_layer - 1 && !batch && !params.all_logits && n > 1) {
            // Only the last position's logits are wanted: the rest of the graph is one row.
            NodeMeta mtail;
            mtail.src_row = n - 1;
            x = b.node(Op::TailRow, {full(x)}, 1, c.n_embd, mtail, "tail_row");
            n = 1;
        }
        h = norm(x, "ffn_norm.weight", n);
        int gate = matmul(h, L + "ffn_gate.weight", "", n, c.n_ff, Role::Gate);
        int up = matmul(h, L + "ffn_up.weight", "", n, c.n_ff, Role::Up);
        int act = c.ffn_gelu ? b.node(Op::Gelu, {full(gate)}, n, c.n_ff, m0, L + "ffn_gelu")
                             : b.node(Op::Silu, {full(gate)}, n, c.n_ff, m0, L + "ffn_silu");
        act = b.node(Op::Mul, {full(act), full(up)}, n, c.n_ff, m0, L + "ffn_mul");
        int down = matmul(act, L + "ffn_down.weight", "", n, c.n_embd, Role::None);
        if (c.post_norms) down = norm(down, "post_ffw_norm.weight", n);
        x = b.node(Op::Add, {full(x), full(down)}, n, c.n_embd, m0, L + "ffn_residual");
    }
    NodeMeta mn;
    mn.weight = "output_norm.weight";
    mn.eps = c.eps;
    x = b.node(Op::RmsNorm, {full(x)}, n, c.n_embd, mn, "output_norm");
    NodeMeta mo;
    mo.weight = c.output_weight;
    b.g.output = b.node(Op::MatMul, {full(x)}, n, c.n_vocab, mo, "output");
    if (c.final_softcap != 0.0f) {
        NodeMeta mc;
        mc.scale = c.final_softcap;
        b.g.output = b.node(Op::SoftCap, {full(b.g.output)}, n, c.n_vocab, mc, "output_softcap");
    }
    return b.g;
}

}  // namespace minfer
