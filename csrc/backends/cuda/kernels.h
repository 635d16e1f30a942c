// The CUDA kernels as the backend calls them: host functions that launch on a
// stream (and check the launch).  Matrices are row-major f32 with a leading
// dimension (a column window of a wider buffer is just a pointer and an ld).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace minfer::cuda {

// Device-side input errors (a token id or position out of range) are recorded
// here and raised by the backend at the next synchronize.
enum ErrorBits : uint32_t { kBadTokenId = 1, kBadPosition = 2, kNanLogit = 4 };

bool type_supported(uint32_t type);
// Bytes of a row in device memory (the GGUF row, but Q6_K's padded to 16 bytes: q6k_layout.cuh).
int64_t row_bytes(uint32_t type, int64_t cols);
// A tensor's bytes as the device holds them: `rows` GGUF rows of `cols` values (src, packed) -> dst
// (row_bytes(type, cols) a row; Q6_K rows laid out by q6k_lay_rows, other types copied).
void lay_rows(uint32_t type, const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols);

// y[r, o] = dot(x[r, :K], W[o, :K]) (+ bias[o]) for r < n_rows <= kMatvecMaxRows (matvec.cu).
// Several weights ("parts", any types, same K) in one launch: part p writes
// columns [y_col, y_col + n_out) of y; with swiglu, parts 0 and 1 are gate and
// up and y[r, o] = silu(gate . x) * (up . x).  x rows 16-byte aligned, K % 32 == 0.
constexpr int kMatvecMaxRows = 4;
struct MatvecPart {
    const uint8_t* W = nullptr;
    const float* bias = nullptr;
    int64_t rb = 0;        // bytes per weight row
    uint32_t type = 0;
    int64_t n_out = 0;     // rows of W used
    int64_t y_col = 0;
};
// FusedQkvRope's decode epilogue (matvec_q8 with parts q, k, v; the pipe kernel only, where
// matvec_q8_rope_fusable says so): q rotated in y, k rotated and v stored into the f16/f32 cache at *pos (a batch
// step's: at its pool row, *rows).
struct QkvRopeEpilogue {
    const int32_t* pos = nullptr;   // null: no epilogue
    const int32_t* rows = nullptr;  // a batch step: the token's pool row; null: its position's row
    int head_dim = 0, rope_dim = 0, n_ctx = 0;  // fusable with rope_dim == head_dim
    int ring = 0;                               // > 0: a local layer's ring of rows (position p in row p % ring)
    float base = 0.0f, scale = 1.0f;
    bool neox = false;
    uint32_t kv_type = 0;
    void* K = nullptr;
    void* V = nullptr;
    uint32_t* err = nullptr;
};
struct MatvecArgs {
    MatvecPart part[3];
    int n_parts = 1;
    bool swiglu = false;
    bool gelu = false;  // with swiglu: the gate's activation is GELU (gemma), not SiLU
    int64_t K = 0;
    const float* x = nullptr;
    int64_t ldx = 0;
    int n_rows = 1;
    float* y = nullptr;
    int64_t ldy = 0;
    QkvRopeEpilogue rope;
    // Read by the spread builds of the block kernel alone (matvec_q8's spread_grid): the
    // launch's n rows dealt to its blocks, block g taking spread_q + (g < spread_r) of them (<= 8).
    int64_t spread_q = 0, spread_r = 0;
};
void matvec(const MatvecArgs& a, cudaStream_t s);
// The same on 8-bit activations (matvec_q8.cu): x quantized into `scratch` (matvec_q8_scratch_bytes; laid
// out as q8_act), then integer dot products; `quantized`: the scratch already holds x (add_rmsnorm wrote
// it).  For Q4_0, Q5_0, Q8_0, Q4_K and Q6_K weights with K % 64 == 0 (every part).
struct Q8Act {             // rows of K activations in blocks of 32: q [rows][K], ds [rows][K / 32] = (d, d sum(q))
    int8_t* q = nullptr;
    float2* ds = nullptr;
};
Q8Act q8_act(void* scratch, int rows, int64_t K);
// A batch product's activations in gemm_mma's bf16 layout (mma_act.cuh: mma_act_bytes(rows, K) bytes), which
// the kernel before the product writes beside its f32 output (add_rmsnorm, elementwise's SwiGLU): no mma_act
// launch.  p null: none.
struct MmaAct {
    void* p = nullptr;
    int rows = 0;
};
bool matvec_q8_supported(uint32_t type, int64_t K);
// Whether matvec_q8 takes `rows` activation rows of these weights in one pass over them (its rows kernel:
// kMatvecQ8MaxRows rows of Q4_K or Q6_K weights, K >= 1024; a batch step of two sequences).
constexpr int kMatvecQ8MaxRows = 2;
bool matvec_q8_rows_fits(uint32_t type, int64_t rows, int64_t K);
size_t matvec_q8_scratch_bytes(int rows, int64_t K);
// Whether matvec_q8's Q4_K rows of K values take the pipe kernel's whole-row build (at most two chunks a lane,
// 2048 < K <= 4096), which asks for all its weights before its PDL wait (add_rmsnorm's rule reads it).
bool matvec_q8_whole_row(int64_t K);
void matvec_q8(const MatvecArgs& a, void* scratch, bool quantized, cudaStream_t s);
// Whether matvec_q8 takes `a` with a.rope set (else: the projection, then rope_kv_store).
bool matvec_q8_rope_fusable(const MatvecArgs& a);

// Prefill: W [N, K] -> f16, x [M, K] -> f16, then y = x W^T (+ bias) on the tensor cores (gemm.cu).
void dequantize_f16(uint32_t wtype, const uint8_t* W, int64_t N, int64_t K, __half* out, cudaStream_t s);
void convert_f16(const float* x, int64_t ldx, int64_t M, int64_t K, __half* out, cudaStream_t s);
// Where the output has few tiles, K is split over gemm_splits() blocks whose
// partials (`partial`: splits * M * N floats; nullptr: never split) are summed in order.
int gemm_splits(int64_t M, int64_t N, int64_t K);
void gemm_f16(const __half* A, const __half* B, int64_t M, int64_t N, int64_t K, float* y, int64_t ldy,
              const float* bias, float* partial, cudaStream_t s);
// A batch's decode product (1..64 rows, K a multiple of 64): weights dequantized slice by slice in shared
// memory, never in full; partial: gemm_q_splits(M, N, K) * M * N floats of scratch (or null: no split).
bool gemm_q_fits(int64_t M, int64_t K);
int gemm_q_splits(int64_t M, int64_t N, int64_t K);
void gemm_q(uint32_t wtype, const __half* X, int64_t M, const uint8_t* W, int64_t N, int64_t K, float* y, int64_t ldy,
            const float* bias, float* partial, cudaStream_t s);

// A batch's decode product on 8-bit activations (gemm_q8.cu): x already quantized (quantize_q8, laid out as
// q8_act), Q4_K / Q6_K / Q8_0 weights, int8 tensor-core products; each weight byte read once a call.
// partial: gemm_q8_splits(...) * M * N floats of scratch (or null: no split).
constexpr int kGemmQ8MaxRows = 64;
bool gemm_q8_fits(uint32_t type, int64_t M, int64_t K);
int gemm_q8_splits(uint32_t type, int64_t M, int64_t N, int64_t K);
void gemm_q8(uint32_t wtype, Q8Act x, int64_t M, int64_t K, const uint8_t* W, int64_t N, float* y, int64_t ldy,
             const float* bias, float* partial, cudaStream_t s);
// The same on the bf16 tensor cores (gemm_mma.cu): x laid out by mma_act (mma_act_bytes of scratch), the quants
// decoded to bf16 with their scales; partial: gemm_mma_splits(...) * M * N floats (or null: no split), whose K
// ranges the last block of each 64 weight rows sums at up to 8 rows (no reduce launch), counted in `counters`: at
// least kGemmMmaCounters ints, zero before the call and after it.
constexpr int kGemmMmaMinRows = 3, kGemmMmaMaxRows = 64;  // the batch step takes it from kGemmMmaMinRows rows
constexpr int kGemmMmaCounters = 4096;  // blocks of 64 weight rows: 262,144 rows
bool gemm_mma_fits(uint32_t type, int64_t M, int64_t K);
int gemm_mma_splits(uint32_t type, int64_t M, int64_t N, int64_t K);
size_t mma_act_bytes(int rows, int64_t K);
void mma_act(const float* x, int64_t ldx, int rows, int64_t K, void* out, cudaStream_t s);
// Throws, naming `kernel`, unless xb (if set) is the layout of `rows` rows (at most kGemmMmaMaxRows) of `cols`
// values (a multiple of 128) that a kernel writing it beside its output needs.
void check_mma_act(const char* kernel, MmaAct xb, int rows, int64_t cols);
void gemm_mma(uint32_t wtype, const void* x, int64_t M, int64_t K, const uint8_t* W, int64_t N, float* y, int64_t ldy,
              const float* bias, float* partial, int* counters, cudaStream_t s);
// Up to kMmaMaxParts weights of one type and width in one launch (q, k and v; gate and up), each into its own
// output (y[:, :N], ldy apart, + bias).  partial: gemm_mma_partial_floats(...) floats of scratch, part by part
// (or null: no split; 0 floats: the launch does not split).
constexpr int kMmaMaxParts = 3;
struct MmaPart {
    const uint8_t* W = nullptr;
    int64_t N = 0;
    float* y = nullptr;
    int64_t ldy = 0;
    const float* bias = nullptr;
};
int gemm_mma_splits(uint32_t type, int64_t M, const MmaPart* parts, int n, int64_t K);
size_t gemm_mma_partial_floats(uint32_t type, int64_t M, const MmaPart* parts, int n, int64_t K);
// glu (1 silu, 2 gelu): parts are a GLU pair (gate, up of one height) whose act(gate) x up goes to the gate's
// output (and in gemm_mma's layout where xb.p) when the launch's K ranges are summed by a launch after it
// (more than 8 rows, K split); returns whether it was (else the caller applies it).
bool gemm_mma(uint32_t wtype, const void* x, int64_t M, int64_t K, const MmaPart* parts, int n, float* partial,
              int* counters, cudaStream_t s, int glu = 0, MmaAct xb = {});
// x [rows, K] (ldx apart) rounded to 8-bit blocks of 32 into q8 (matvec_q8's activations).
void quantize_q8(const float* x, int64_t ldx, int rows, int64_t K, Q8Act q8, cudaStream_t s);
// How many ranges of K the batch products split a weight into: `blocks` of its rows, `slices` along K.
int stream_splits(int64_t blocks, int64_t slices);
// y = the sum over `splits` partials [splits][M][N] in order (+ bias): split K's second step.
void gemm_reduce(const float* partial, int splits, int64_t M, int64_t N, float* y, int64_t ldy, const float* bias,
                 cudaStream_t s);

// Embedding gather: y[r, :] = dequant(W[ids[r], :]) (elementwise.cu).
void get_rows(uint32_t wtype, const uint8_t* W, int64_t n_rows_w, int64_t K, const int32_t* ids, int rows,
              float* y, int64_t ldy, uint32_t* err, cudaStream_t s);

// RmsNorm over groups of `width` columns (width == cols: RmsNorm; head_dim: QkNorm) (norm_rope.cu).
// Returns whether it also wrote q8 (decode's whole-row norm, out of place, with q8.q set).
bool rmsnorm(const float* x, int64_t ldx, float* y, int64_t ldy, int rows, int cols, int width,
             const float* w, float eps, Q8Act q8, cudaStream_t s);
// y[:, :cols] = a + b, y[:, cols:] = RmsNorm(a + b) (the residual add fused with the next norm).
// With q8.q set, the norm is also written as decode's 8-bit activations (matvec_q8).  before_attention: the
// norm feeds the q/k/v projection (an attn_norm; else the FFN's or the output's), q4k: whose q rows are Q4_K --
// the inputs of add_norm_kernel's launch rule.  With xb.p set (xb.rows == rows <= 64, cols % 128 == 0), the
// norm is also written in gemm_mma's layout where the float4 kernel takes the row (cols <= 4096, rows 16-byte
// aligned); returns whether it was.
bool add_rmsnorm(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int rows, int cols,
                 const float* w, float eps, Q8Act q8, cudaStream_t s, bool before_attention = false, bool q4k = false,
                 MmaAct xb = {});
void rope(const float* x, int64_t ldx, float* y, int64_t ldy, const int32_t* pos, int rows, int cols,
          int head_dim, int rope_dim, float base, float scale, bool neox, cudaStream_t s);
void kv_store(uint32_t kv_type, const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* pos,
              int rows, int dim, int n_ctx, int ring, void* K, void* V, uint32_t* err, cudaStream_t s);

// rope(q) into y, rope(k) and v stored at the rows' positions (or pool rows): the decode fusion (norm_rope.cu).
struct RopeStoreShape {
    int rows, q_cols, kv_dim, head_dim, rope_dim;
    float base, scale;
    bool neox;
    uint32_t kv_type;
    int n_ctx;
    int ring;  // as QkvRopeEpilogue
};
// rows: a batch step's pool row of each token (null: each token's position's row).
void rope_kv_store(const RopeStoreShape& sh, const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                   int64_t ldv, const int32_t* pos, const int32_t* rows, float* y, int64_t ldy, void* K, void* V,
                   uint32_t* err, cudaStream_t s);

// Causal GQA attention of q over the cache, split over the KV length (attention.cu).
struct AttnShape {
    int rows, n_head, n_head_kv, head_dim, n_ctx;
    uint32_t kv_type;
    float scale;
    int window = 0;  // > 0: a row at p sees keys p - window < j <= p (the general kernel only)
    int ring = 0;    // > 0: the cache is a ring of rows, position p in row p % ring (the general kernel only)
};
// A batch step's paged KV (null seq: one sequence, row = position): key j of row r's sequence is in pool
// block tables[seq[r] * max_blocks + j / block_size].
struct KvPages {
    const int32_t* seq = nullptr;
    const int32_t* tables = nullptr;
    int max_blocks = 0, block_size = 0;
};
bool attention_uses_tensor_cores(const AttnShape& a);  // f16 cache, >= 16 rows, head_dim 64 or 128
int attention_splits(const AttnShape& a);                 // grid's split count (fixed per shape)
size_t attention_scratch_floats(const AttnShape& a);      // partials for the combine step
// With q8.q and more than one split (attention_splits), the combine step (or the cluster merge) also
// rounds the output to 8-bit blocks for the decode matvec after it (head_dim % 32 == 0).
void attention(const AttnShape& a, const float* q, int64_t ldq, const int32_t* pos, const void* K, const void* V,
               float* out, int64_t ldo, float* scratch, uint32_t* err, Q8Act q8, cudaStream_t s);
// Attention of a batch step over the paged pool (a.n_ctx: one sequence's context, max_blocks * block_size):
// the general kernel, every row's keys split in chunks, and the combine.  With xb.p (xb.rows == a.rows, the
// output's width a multiple of 128), the kernel that writes the output (the combine, or the tensor-core kernel
// unsplit) also writes it in gemm_mma's layout; returns whether it did.
size_t attention_paged_scratch_floats(const AttnShape& a);
bool attention_paged(const AttnShape& a, const KvPages& pages, const float* q, int64_t ldq, const int32_t* pos,
                     const void* K, const void* V, float* out, int64_t ldo, float* scratch, uint32_t* err,
                     cudaStream_t s, MmaAct xb = {});

// Elementwise ops (elementwise.cu).
enum class Ew { Add, Mul, Silu, SwiGLU, Gelu, GeGLU, Scale, SoftCap };
// scale: Scale's factor, SoftCap's cap.  With xb.p set (xb.rows == rows, cols % 128 == 0), y is also written in
// gemm_mma's layout (a SwiGLU's output, the down projection's input).
void elementwise(Ew op, const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int rows,
                 int cols, cudaStream_t s, float scale = 1.0f, MmaAct xb = {});
// out = index of the largest of x[0..n), the first on ties (greedy decoding on the device).
// partial: kArgmaxBlocks floats + kArgmaxBlocks ints of device scratch.
constexpr int kArgmaxBlocks = 1024;
// Greedy decode chained on the device: row r's winner is also the next step's token (token[r]), its position
// input advances by one (pos[r]), and the winner is written to result[r] (host-mapped) -- no host turn between
// steps.  A batch step's rows (one a sequence) also find the KV slot of that next position through their block
// tables (slot[r] = tables[r * max_blocks + p / block_size] * block_size + p % block_size; -1 past the table).
struct ArgmaxFeed {
    int32_t* token = nullptr;
    int32_t* pos = nullptr;
    int32_t* result = nullptr;
    int32_t* slot = nullptr;
    const int32_t* tables = nullptr;
    int block_size = 0, max_blocks = 0;
};
// A NaN among the n values sets kNanLogit in *err (NaN is never the winner).  allow (device memory): nullptr,
// or constrained decoding's bitmask of the indices that may win (bit i of allow[i / 32]).
void argmax(const float* x, int n, int* out, void* partial, uint32_t* err, cudaStream_t s,
            const uint32_t* allow = nullptr);
// The same for `rows` rows of n (ldx apart; their masks ld_allow words apart), winners to out[0..rows): a launch
// pair for as many rows as their partials fit the kArgmaxBlocks of scratch (26 of a 152k vocabulary), not a pair a row.
void argmax_rows(const float* x, int64_t ldx, int n, int rows, int* out, void* partial, uint32_t* err, cudaStream_t s,
                 const uint32_t* allow = nullptr, int64_t ld_allow = 0);
// The same, each row's winner fed to the next step of a greedy chain (feed's row fields, rows of them; a single
// sequence's chain is one row with no slot).
void argmax_rows_feed(const float* x, int64_t ldx, int n, int rows, const ArgmaxFeed& feed, void* partial,
                      uint32_t* err, cudaStream_t s);
// Each of `rows` rows of n floats (ld apart)'s k best values and their indices, into vals / ids [rows, k] (device
// or host-mapped memory), ordered by value descending, then index ascending (the sampler's top_k); 0 < k < n,
// k <= kTopKMax.  A NaN sets kNanLogit in *err and is never chosen.  scratch: top_k_scratch_bytes of device memory.
constexpr int kTopKMax = 256;
size_t top_k_scratch_bytes(int n, int rows, int k);
void top_k_rows(const float* x, int64_t ld, int n, int rows, int k, float* vals, int32_t* ids, void* scratch,
                uint32_t* err, cudaStream_t s);
void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int rows, int cols, cudaStream_t s);
// y row r = x row idx[r] (PickRows: each sequence's last row of a batch step); idx checked against x_rows.
void pick_rows(const float* x, int64_t ldx, int x_rows, const int32_t* idx, float* y, int64_t ldy, int rows, int cols,
               uint32_t* err, cudaStream_t s);

}  // namespace minfer::cuda
