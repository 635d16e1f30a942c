// The fusion pass.  Each rule rewrites a small pattern into one node that a
// backend has a kernel for; consumers are rewired to column windows of the
// fused output, and the absorbed nodes are dropped at the end.
#include <map>

#include "common/error.h"
#include "graph/passes.h"

namespace minfer {

namespace {

struct Fuser {
    Graph& g;
    const std::vector<BackendSlot>& slots;
    std::vector<std::vector<int>> consumers;  // node -> consumer nodes
    std::vector<bool> dead;
    int rewrites = 0;

    void count_consumers() {
        consumers.assign(g.nodes.size(), {});
        for (size_t i = 0; i < g.nodes.size(); i++)
            if (!dead[i])
                for (const NodeInput& in : g.nodes[i].in) consumers[size_t(in.node)].push_back(int(i));
    }
    Node& at(int i) { return g.nodes[size_t(i)]; }
    bool can(Op fused, std::initializer_list<int> nodes) {
        int b = at(*nodes.begin()).backend;
        for (int n : nodes)
            if (at(n).backend != b) return false;
        return slots[size_t(b)].backend->supports_fused(fused);
    }
    bool sole_consumer(int producer, int consumer) {
        return producer != g.output && consumers[size_t(producer)].size() == 1 &&
               consumers[size_t(producer)][0] == consumer;
    }
    static bool whole(const NodeInput& in) { return in.col == 0 && in.cols == -1; }
    static bool same(const NodeInput& a, const NodeInput& b) {
        return a.node == b.node && a.col == b.col && a.cols == b.cols;
    }
    // Every input that reads `from` now reads columns [col, col + cols) of `to`.
    void redirect(int from, int to, int col, int cols) {
        for (int c : consumers[size_t(from)])
            for (NodeInput& in : at(c).in)
                if (in.node == from) {
                    in.node = to;
                    in.col += col;
                    if (in.cols == -1) in.cols = cols;
                }
    }

    // Mul(Silu(a), b) -> SwiGLU(a, b) and Mul(Gelu(a), b) -> GeGLU(a, b).
    void glu() {
        count_consumers();
        for (size_t i = 0; i < g.nodes.size(); i++) {
            Node& m = g.nodes[i];
            if (dead[i] || m.op != Op::Mul) continue;
            for (int side = 0; side < 2; side++) {
                int s = m.in[size_t(side)].node;
                const Op act = at(s).op;
                const Op fused = act == Op::Silu ? Op::SwiGLU : act == Op::Gelu ? Op::GeGLU : Op::Count;
                if (fused == Op::Count || !whole(m.in[size_t(side)]) || !sole_consumer(s, int(i)) ||
                    !can(fused, {int(i), s}))
                    continue;
                NodeInput other = m.in[size_t(1 - side)];
                m.op = fused;
                m.in = {at(s).in[0], other};
                dead[size_t(s)] = true;
                rewrites++;
                break;
            }
        }
    }

    // A backend that fuses GeGLU runs FusedFFN with act = Gelu too.
    void ffn() {
        count_consumers();
        for (size_t i = 0; i < g.nodes.size(); i++) {
            Node& w = g.nodes[i];
            if (dead[i] || (w.op != Op::SwiGLU && w.op != Op::GeGLU)) continue;
            int gate = w.in[0].node, up = w.in[1].node;
            Node &G = at(gate), &U = at(up);
            if (G.op != Op::MatMul || U.op != Op::MatMul || G.meta.role != Role::Gate || U.meta.role != Role::Up ||
                !G.meta.bias.empty() || !U.meta.bias.empty() || !whole(w.in[0]) || !whole(w.in[1]) ||
                !same(G.in[0], U.in[0]) || !sole_consumer(gate, int(i)) || !sole_consumer(up, int(i)) ||
                !can(Op::FusedFFN, {int(i), gate, up}))
                continue;
            w.meta.act = w.op == Op::GeGLU ? Act::Gelu : Act::Silu;
            w.op = Op::FusedFFN;
            w.meta.w_gate = G.meta.weight;
            w.meta.w_up = U.meta.weight;
            w.meta.layer = G.meta.layer;
            w.in = {G.in[0]};
            w.name = "blk." + std::to_string(G.meta.layer) + ".ffn_gate_up";
            dead[size_t(gate)] = dead[size_t(up)] = true;
            rewrites++;
        }
    }

    void qkv() {
        count_consumers();
        std::map<int, int> q_of_layer, k_of_layer, v_of_layer;
        for (size_t i = 0; i < g.nodes.size(); i++) {
            const Node& n = g.nodes[i];
            if (dead[i] || n.op != Op::MatMul) continue;
            if (n.meta.role == Role::Q) q_of_layer[n.meta.layer] = int(i);
            if (n.meta.role == Role::K) k_of_layer[n.meta.layer] = int(i);
            if (n.meta.role == Role::V) v_of_layer[n.meta.layer] = int(i);
        }
        for (auto [layer, q] : q_of_layer) {
            if (!k_of_layer.count(layer) || !v_of_layer.count(layer)) continue;
            int k = k_of_layer[layer], v = v_of_layer[layer];
            Node &Q = at(q), &K = at(k), &V = at(v);
            if (!same(Q.in[0], K.in[0]) || !same(Q.in[0], V.in[0]) || !can(Op::FusedQKV, {q, k, v})) continue;
            NodeMeta m;
            m.layer = layer;
            m.wq = Q.meta.weight, m.wk = K.meta.weight, m.wv = V.meta.weight;
            m.bq = Q.meta.bias, m.bk = K.meta.bias, m.bv = V.meta.bias;
            m.q_cols = Q.cols, m.k_cols = K.cols, m.v_cols = V.cols;
            int qc = Q.cols, kc = K.cols, vc = V.cols;
            redirect(q, q, 0, qc);  // keep q's consumers pointing at the fused node (q's slot) with a window
            redirect(k, q, qc, kc);
            redirect(v, q, qc + kc, vc);
            Node& F = at(q);
            F.op = Op::FusedQKV;
            F.meta = m;
            F.cols = qc + kc + vc;
            F.name = "blk." + std::to_string(layer) + ".attn_qkv";
            dead[size_t(k)] = dead[size_t(v)] = true;
            rewrites++;
        }
    }

    void qkv_norm() {
        count_consumers();
        for (size_t i = 0; i < g.nodes.size(); i++) {
            Node& f = g.nodes[i];
            if (dead[i] || f.op != Op::FusedQKV) continue;
            int qn = -1, kn = -1;
            bool ok = true;
            for (int c : consumers[i]) {
                const Node& n = at(c);
                if (n.op != Op::QkNorm) continue;
                const NodeInput& in = n.in[0];
                if (in.col == 0 && in.cols == f.meta.q_cols) qn = c;
                else if (in.col == f.meta.q_cols && in.cols == f.meta.k_cols) kn = c;
            }
            if (qn < 0 || kn < 0 || !can(Op::FusedQkvNorm, {int(i), qn, kn})) continue;
            for (int c : consumers[i])  // nothing else may read the un-normalized q or k
                if (c != qn && c != kn) {
                    for (const NodeInput& in : at(c).in)
                        if (in.node == int(i) && in.col < f.meta.q_cols + f.meta.k_cols) ok = false;
                }
            if (!ok) continue;
            f.op = Op::FusedQkvNorm;
            f.meta.q_norm = at(qn).meta.weight;
            f.meta.k_norm = at(kn).meta.weight;
            f.meta.eps = at(qn).meta.eps;
            f.meta.head_dim = at(qn).meta.head_dim;
            redirect(qn, int(i), 0, f.meta.q_cols);
            redirect(kn, int(i), f.meta.q_cols, f.meta.k_cols);
            dead[size_t(qn)] = dead[size_t(kn)] = true;
            rewrites++;
        }
    }

    // KvStore(Rope(k), v) and the Rope(q) its layer's Attn reads, with the same
    // rotation at the positions the store writes (or, a batch step's paged
    // store, at any positions: its rows come as a fifth input): one node that
    // rotates q (its output), rotates k and stores k and v.  The Attn reads q
    // from it and, as its ordering input, waits on it.
    void rope_store() {
        count_consumers();
        for (size_t i = 0; i < g.nodes.size(); i++) {
            const Node& S = g.nodes[i];
            if (dead[i] || S.op != Op::KvStore || consumers[i].size() != 1) continue;
            const int st = int(i), attn = consumers[i][0], rk = S.in[0].node;
            Node& A = at(attn);
            if (A.op != Op::Attn || A.in[2].node != st) continue;
            const int rq = A.in[0].node;
            const Node &RK = at(rk), &RQ = at(rq);
            if (RK.op != Op::Rope || RQ.op != Op::Rope || !whole(S.in[0]) || !whole(A.in[0]) ||
                !sole_consumer(rk, st) || !sole_consumer(rq, attn))
                continue;
            const bool paged = S.meta.block_size > 0;  // its store rows are pool rows, not the positions
            if (!same(RQ.in[1], RK.in[1]) || (!paged && !same(RQ.in[1], S.in[2])) || RQ.meta.head_dim != RK.meta.head_dim ||
                RQ.meta.rope_dim != RK.meta.rope_dim || RQ.meta.rope_base != RK.meta.rope_base ||
                RQ.meta.rope_scale != RK.meta.rope_scale ||
                RQ.meta.rope_neox != RK.meta.rope_neox || RQ.meta.head_dim != S.meta.head_dim ||
                !can(Op::RopeKvStore, {rq, rk, st}))
                continue;
            NodeMeta m = S.meta;
            m.rope_dim = RQ.meta.rope_dim;
            m.rope_base = RQ.meta.rope_base;
            m.rope_scale = RQ.meta.rope_scale;
            m.rope_neox = RQ.meta.rope_neox;
            Node& F = at(rq);
            F.in = {RQ.in[0], RK.in[0], S.in[1], RQ.in[1]};
            if (paged) F.in.push_back(S.in[2]);
            F.op = Op::RopeKvStore;
            F.meta = m;
            F.name = "blk." + std::to_string(m.layer) + ".rope_kv_store";
            A.in[2] = NodeInput{rq, 0, -1};
            dead[size_t(rk)] = dead[i] = true;
            rewrites++;
        }
    }

    // RopeKvStore reading the q, k and v windows of one FusedQKV (and nothing
    // else reading it): the projection's own end rotates q and k and stores k
    // and v (the CUDA decode matvec does it in its epilogue).  The node keeps
    // the FusedQKV's output, with q rotated; the Attn reads that window and
    // orders after it.
    void qkv_rope() {
        count_consumers();
        for (size_t i = 0; i < g.nodes.size(); i++) {
            const Node& F = g.nodes[i];
            if (dead[i] || F.op != Op::RopeKvStore || int(i) == g.output) continue;
            const int qkv = F.in[0].node;
            Node& Q = at(qkv);
            const NodeMeta& m = Q.meta;
            if (Q.op != Op::FusedQKV || qkv == g.output || F.in[1].node != qkv || F.in[2].node != qkv ||
                consumers[size_t(qkv)].size() != 3 || F.in[0].col != 0 || F.in[0].cols != m.q_cols ||
                F.in[1].col != m.q_cols || F.in[1].cols != m.k_cols || F.in[2].col != m.q_cols + m.k_cols ||
                F.in[2].cols != m.v_cols || F.meta.n_head_kv * F.meta.head_dim != m.k_cols || m.k_cols != m.v_cols ||
                !can(Op::FusedQkvRope, {qkv, int(i)}))
                continue;
            const int layer = Q.meta.layer;
            NodeMeta fm = F.meta;  // the rotation and the cache
            Q.op = Op::FusedQkvRope;
            Q.in = {Q.in[0], F.in[3]};  // x, the positions (and a batch's pool rows)
            if (F.in.size() > 4) Q.in.push_back(F.in[4]);
            Q.meta.head_dim = fm.head_dim;
            Q.meta.n_head_kv = fm.n_head_kv;
            Q.meta.rope_dim = fm.rope_dim;
            Q.meta.rope_base = fm.rope_base;
            Q.meta.rope_scale = fm.rope_scale;
            Q.meta.rope_neox = fm.rope_neox;
            Q.meta.kv_type = fm.kv_type;
            Q.meta.n_ctx = fm.n_ctx;
            Q.meta.kv_ring = fm.kv_ring;
            Q.meta.layer = fm.layer >= 0 ? fm.layer : layer;
            Q.name = "blk." + std::to_string(Q.meta.layer) + ".qkv_rope";
            redirect(int(i), qkv, 0, m.q_cols);  // the Attn: q and its ordering input
            dead[i] = true;
            rewrites++;
        }
    }

    // RmsNorm(Add(a, b)): one node writes the sum (the residual stream, columns
    // [0, n)) and its normalization (columns [n, 2n)); the Add's consumers
    // read the first window, the RmsNorm's the second.
    void add_norm() {
        count_consumers();
        for (size_t i = 0; i < g.nodes.size(); i++) {
            Node& N = g.nodes[i];
            if (dead[i] || N.op != Op::RmsNorm || int(i) == g.output || !whole(N.in[0])) continue;
            const int add = N.in[0].node;
            Node& A = at(add);
            if (A.op != Op::Add || A.cols != N.cols || A.rows != N.rows || add == g.output ||
                !can(Op::AddRmsNorm, {add, int(i)}))
                continue;
            const int n = A.cols;
            redirect(add, add, 0, n);  // the sum's readers (N among them, dropped below)
            redirect(int(i), add, n, n);
            A.op = Op::AddRmsNorm;
            A.cols = 2 * n;
            A.meta.weight = N.meta.weight;
            A.meta.eps = N.meta.eps;
            A.name = N.name + "+residual";
            dead[i] = true;
            rewrites++;
        }
    }

    // What a kernel needs to know of its consumers: an AddRmsNorm whose norm feeds a layer's q/k/v
    // projection records that projection's q weight (the CUDA backend times the next launch by its type); an
    // AddRmsNorm, Attn or FusedFFN read by a projection records its (first) weight (the CUDA backend writes a
    // batch product's activations for it where its type takes that product).
    void annotate() {
        count_consumers();
        for (size_t i = 0; i < g.nodes.size(); i++) {
            Node& N = g.nodes[i];
            if (dead[i] || (N.op != Op::AddRmsNorm && N.op != Op::Attn && N.op != Op::FusedFFN)) continue;
            for (int c : consumers[i]) {
                const Node& C = at(c);
                const bool qkv = C.op == Op::FusedQKV || C.op == Op::FusedQkvNorm || C.op == Op::FusedQkvRope;
                if (N.op == Op::AddRmsNorm && qkv) N.meta.feeds_q = C.meta.wq;
                else if (N.op == Op::AddRmsNorm && C.op == Op::MatMul && C.meta.role == Role::Q) N.meta.feeds_q = C.meta.weight;
                if (qkv) N.meta.feeds = C.meta.wq;
                else if (C.op == Op::FusedFFN) N.meta.feeds = C.meta.w_gate;
                else if (C.op == Op::MatMul) N.meta.feeds = C.meta.weight;
            }
        }
    }

    void compact() {
        std::vector<int> remap(g.nodes.size(), -1);
        std::vector<Node> kept;
        for (size_t i = 0; i < g.nodes.size(); i++)
            if (!dead[i]) {
                remap[i] = int(kept.size());
                kept.push_back(std::move(g.nodes[i]));
            }
        for (Node& n : kept)
            for (NodeInput& in : n.in) {
                in.node = remap[size_t(in.node)];
                if (in.node < 0) throw MinferError(strfmt("fusion left node '%s' reading a removed node", n.name.c_str()));
            }
        g.output = remap[size_t(g.output)];
        g.nodes = std::move(kept);
    }
};

}  // namespace

int fuse(Graph& g, const std::vector<BackendSlot>& slots) {
    Fuser f{g, slots, {}, std::vector<bool>(g.nodes.size(), false)};
    f.glu();
    f.ffn();
    f.qkv();
    f.qkv_norm();
    f.rope_store();
    f.qkv_rope();
    f.add_norm();
    f.annotate();
    f.compact();
    return f.rewrites;
}

}  // namespace minfer
