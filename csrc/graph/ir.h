// The graph IR: one node per math op of the transformer.
//
// Every activation is a row-major f32 matrix [rows, cols] (rows = tokens of the
// step, or 1 after TailRow).  Token ids and positions travel as int32 bit
// patterns in f32 buffers (Input nodes).  A node reads column windows of its
// inputs (NodeInput.col / .cols): that is how the q, k and v parts of a fused
// QKV output are consumed without copies.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace minfer {

enum class Op : uint8_t {
    Input,         // tokens or positions of this step, written by the session
    GetRows,       // embedding gather: rows of meta.weight at the token ids of input 0
    TailRow,       // the last row of input 0 (only the last position needs logits)
    RmsNorm,       // x / sqrt(mean(x^2) + eps) * meta.weight
    QkNorm,        // RmsNorm per head (head_dim wide) with a [head_dim] weight (qwen3)
    MatMul,        // x W^T (+ meta.bias); W = meta.weight [cols, x.cols]
    Rope,          // rotary embedding of input 0 at the positions of input 1
    KvStore,       // write k (input 0) and v (input 1) at positions (input 2) into layer's KV
    Attn,          // causal GQA attention of q (input 0) over the layer's KV, positions input 1;
                   // input 2 is the layer's KvStore (an ordering dependency); meta.window > 0: sliding window
    Add,           // a + b
    Mul,           // a * b
    Silu,          // x * sigmoid(x)
    SwiGLU,        // silu(a) * b                                         (fusion of Mul(Silu(a), b))
    FusedQKV,      // [q | k | v] = x [Wq | Wk | Wv]^T + biases           (fusion of 3 MatMuls)
    FusedQkvNorm,  // FusedQKV, then QkNorm of the q and k parts (qwen3)
    FusedFFN,      // act(x Wg^T) * (x Wu^T), act silu or gelu (meta.act)  (fusion of 2 MatMuls + SwiGLU/GeGLU)
    RopeKvStore,   // rope(q) out; rope(k) and v stored at the positions    (fusion of 2 Ropes + KvStore)
                   // inputs q, k, v, positions (a batch step: and each token's pool row, input 4, where they go);
                   // the layer's Attn reads q from it and orders after it
    AddRmsNorm,    // [a + b | RmsNorm(a + b)], 2 x cols wide                (fusion of Add + RmsNorm)
    FusedQkvRope,  // FusedQKV whose q is rotated (out [rope(q) | k | v]) and whose rope(k), v are stored
                   // at the positions (input 1; a batch step: at the pool rows of input 2)
                   //                                                      (fusion of FusedQKV + RopeKvStore)
    PickRows,      // rows of input 0 at the indices of input 1 (a batch: each sequence's last row)
    Gelu,          // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))    (the tanh form, as gemma's FFN)
    GeGLU,         // gelu(a) * b                                         (fusion of Mul(Gelu(a), b))
    Scale,         // x * meta.scale                                      (gemma: embeddings times sqrt(n_embd))
    SoftCap,       // meta.scale * tanh(x / meta.scale)                    (final-logit softcapping)
    Count
};
const char* op_name(Op op);

// The ops that store k and v into the layer's KV cache, and those that read or write it (they get the
// layer's KV regions: plan.cpp, and run_ops' cache in bind_engine.cpp).
inline bool stores_kv(Op op) { return op == Op::KvStore || op == Op::RopeKvStore || op == Op::FusedQkvRope; }
inline bool uses_kv(Op op) { return stores_kv(op) || op == Op::Attn; }

// The inputs of a step.  A batch step (GraphParams::n_seqs > 0) lays its rows out sequence by sequence and
// adds: Slots (the KV-pool row each token's k and v go to: KvStore's input 2 instead of the positions),
// SeqIndex (each row's sequence), BlockTables ([n_seqs, max_blocks] pool block ids: Attn's inputs 3, 4)
// and OutRows (the row whose logits each sequence wants: PickRows's input 1).  With a pool of its own for the
// sliding-window layers (GraphParams::n_ctx_local), their KvStore and Attn take LocalSlots and LocalTables.
enum class InputKind : uint8_t { Tokens, Positions, Data, Slots, SeqIndex, BlockTables, OutRows, LocalSlots, LocalTables };  // Data: any f32 matrix (op tests)

struct NodeInput {
    int node = -1;   // producer
    int col = 0;     // first column of the window
    int cols = -1;   // window width (-1: all of the producer's columns)
};

// What a MatMul computes in the layer (the fusion pass pattern-matches on it).
enum class Role : uint8_t { None, Q, K, V, Gate, Up };
// The gate's activation of a FusedFFN.
enum class Act : uint8_t { Silu, Gelu };

struct NodeMeta {
    int layer = -1;
    Role role = Role::None;
    InputKind input = InputKind::Tokens;
    std::string weight, bias;      // MatMul, GetRows, RmsNorm (weight); QkNorm (weight)
    std::string wq, wk, wv, bq, bk, bv, q_norm, k_norm;  // FusedQKV / FusedQkvNorm
    std::string w_gate, w_up;      // FusedFFN
    float eps = 0.0f;
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    int q_cols = 0, k_cols = 0, v_cols = 0;  // fused QKV output layout
    float rope_base = 10000.0f;
    float rope_scale = 1.0f;       // linear RoPE scaling: angles p * rope_scale * base^(-2i/rope_dim)
    int rope_dim = 0;
    bool rope_neox = false;
    float attn_scale = 1.0f;
    int window = 0;                // Attn: a query at position p sees keys p - window < j <= p (0: all j <= p)
    float scale = 1.0f;            // Scale: the factor; SoftCap: the cap
    Act act = Act::Silu;           // FusedFFN: the gate's activation
    uint32_t kv_type = 1;          // ggml type of the KV cache (F16 default)
    int n_ctx = 0;                 // KV rows: the context, or a batch's whole pool
    int kv_ring = 0;               // > 0: a local layer's cache is a ring of this many rows, position p in row
                                   // p % kv_ring (it needs the window plus a step's rows; 0: every position kept)
    int block_size = 0;            // Attn of a batch step: tokens per KV block (0: one contiguous sequence)
    int src_row = 0;               // TailRow: which row of the input
    std::string feeds_q;           // AddRmsNorm: the q weight of the q/k/v projection its norm feeds (fuse sets it)
    std::string feeds;             // AddRmsNorm, Attn, FusedFFN: the (first) weight of the projection reading the output
                                   // (fuse sets it; the CUDA backend writes a batch product's input for it)
};

struct Node {
    Op op = Op::Input;
    std::vector<NodeInput> in;
    int rows = 0, cols = 0;        // output shape
    NodeMeta meta;
    std::string name;              // for traces and errors, e.g. "blk.3.attn_q"
    int backend = -1;              // index into the engine's backend list, set by assignment
};

// What makes two graphs interchangeable: decode steps with equal params reuse one graph.
struct GraphParams {
    int n_tokens = 1;
    bool all_logits = false;       // logits of every position, or only the last
    bool fuse = true;              // run the fusion pass (where the backend supports it)
    uint32_t kv_type = 1;          // F16
    int n_ctx = 0;
    uint32_t gpu_mask = 0;         // which GPU backends participate (bit per backend kind)
    std::string assignment;        // "" (priority order) or a forced pattern, e.g. "alternate:3"
    int n_seqs = 0;                // a batch step of n_seqs sequences over a paged KV pool (0: one sequence)
    int block_size = 0, max_blocks = 0;  // batch: tokens per KV block, blocks per sequence's table
    int n_ctx_local = 0;  // batch: rows of the sliding-window layers' own pool (0: every layer uses the one pool)
    bool operator==(const GraphParams& o) const {
        return n_tokens == o.n_tokens && all_logits == o.all_logits && fuse == o.fuse && kv_type == o.kv_type &&
               n_ctx == o.n_ctx && gpu_mask == o.gpu_mask && assignment == o.assignment && n_seqs == o.n_seqs &&
               block_size == o.block_size && max_blocks == o.max_blocks && n_ctx_local == o.n_ctx_local;
    }
};

struct Graph {
    std::vector<Node> nodes;
    int output = -1;               // the logits node
    GraphParams params;

    int add(Node n) {
        nodes.push_back(std::move(n));
        return int(nodes.size()) - 1;
    }
    // Weight names a node reads (for the all-weights-registered gate).
    static std::vector<std::string> weights_of(const Node& n);
};

}  // namespace minfer
