// Decode's matrix-vector products on 8-bit activations (the recipe of
// llama.cpp's mmvq and of this repo's CPU backend): x is quantized once per
// call into blocks of 32 (d = amax / 127, q = round(x / d) half away from zero,
// plus d * sum(q)), then each lane takes "chunks" of a weight row (one 32-value
// block, or for Q4_K the two 32-value sub-blocks that share 32 bytes of
// nibbles) and dots their integer quants with the block's int8 x four at a
// time (dp4a); the weight and x scales are applied once per chunk.  Against
// the f32 kernel (matvec.cu) this reads a quarter of the x bytes and issues
// about a quarter of the instructions per weight.
//
// A chunk's loads and arithmetic are matvec_q8_chunks.cuh, the kernels that
// walk chunks (warp, block, pipe and stream layouts) matvec_q8_kernels.cuh; this
// file holds the rules that pick one for a launch.  What a weight is -- the element-by-element
// definition -- is dequant8 (dequant.cuh) and csrc/quant/dequantize.cpp;
// tests/test_cuda_matvec.py checks this path against float64 with the bound of
// rounding x to 8 bits.
#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/common.cuh"
#include "backends/kernel_choice.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/matvec_q8_chunks.cuh"
#include "backends/cuda/matvec_rows.cuh"
#include "backends/cuda/rope.cuh"

namespace minfer::cuda {

namespace {

#include "backends/cuda/matvec_q8_kernels.cuh"

// How many chunks of a row of K values a lane of the block and pipe kernels takes, at most (kLanesPerRow lanes a
// row in each of the kMatvecWarps warps, chunks dealt round-robin).
int64_t chunks_a_lane(int64_t K) {
    const int64_t step = kLanesPerRow * kMatvecWarps;
    return (K / 64 + step - 1) / step;
}

}  // namespace

bool matvec_q8_whole_row(int64_t K) { return chunks_a_lane(K) == 2; }

namespace {

// Whether a launch the block kernel would take goes to matvec_q4k_pipe_kernel: rows shorter than 8192 (longer
// ones keep the block kernel unrolled by two, which measured faster there), every part Q4_K or Q6_K and at
// least one Q4_K.  The kernel choice cuda.matvec_pipe forces it off (0) or onto Q6_K alone too (all).
bool pipe_kernel_for(const MatvecArgs& a) {
    const std::string v = forced_kernel("cuda.matvec_pipe");
    if (v == "0") return false;
    bool q4k = false;
    for (int p = 0; p < weight_parts(a); p++) {
        if (a.part[p].type != GGML_TYPE_Q4_K && a.part[p].type != GGML_TYPE_Q6_K) return false;
        q4k |= a.part[p].type == GGML_TYPE_Q4_K;
    }
    return (q4k || v == "all") && a.K < 8192;
}

// How far ahead the pipe kernel loads (1 or 2 chunks, or kWholeRow).  kWholeRow where no lane has more than two
// chunks (33-64 chunks a row, 2048 < K <= 4096): every weight byte of a block is asked for as it starts, at 5
// blocks an SM, and the loads overlap the kernels before it.  Elsewhere 2 where a lane has a second chunk and
// the launch is one wave at 4 blocks an SM, else 1 (two ahead everywhere spilled and measured slower).
// The kernel choice cuda.pipe_ahead forces a build (tests).
int pipe_ahead(int64_t blocks, int64_t K) {
    const int64_t n = chunks_a_lane(K);
    const std::string v = forced_kernel("cuda.pipe_ahead");
    if (v == "1") return 1;
    if (v == "2") return 2;
    if (v == "whole") {
        if (n > 2)
            throw MinferError(strfmt("cuda.pipe_ahead=whole: rows of %lld values have more than two chunks a lane",
                                     (long long)K));
        return kWholeRow;
    }
    if (matvec_q8_whole_row(K)) return kWholeRow;
    return n >= 2 && blocks <= 4 * int64_t(sm_count()) ? 2 : 1;
}

// The pipe kernel's build for a mode of pipe_ahead.
template <bool ROPE>
void (*pipe_kernel(int ahead))(MatvecArgs, XQ) {
    return ahead == kWholeRow ? matvec_q4k_pipe_kernel<kWholeRow, ROPE>
           : ahead == 2       ? matvec_q4k_pipe_kernel<2, ROPE>
                              : matvec_q4k_pipe_kernel<1, ROPE>;
}

using MatvecKernel = void (*)(MatvecArgs, XQ);
using BlockKernel = void (*)(MatvecArgs, XQ, int);

// The weight type every part of the launch has, or kAnyType where they differ.
int launch_type(const MatvecArgs& a) {
    for (int p = 1; p < weight_parts(a); p++)
        if (a.part[p].type != a.part[0].type) return kAnyType;
    return int(a.part[0].type);
}

MatvecKernel warp_kernel_build(const MatvecArgs& a) {
    const int t = a.n_rows == 1 ? launch_type(a) : kAnyType;
    if (t == kAnyType) return a.n_rows == 1 ? matvec_q8_kernel<kAnyType, 1> : matvec_q8_kernel<kAnyType, kR>;
    switch (t) {
        case GGML_TYPE_Q4_0: return matvec_q8_kernel<GGML_TYPE_Q4_0, 1>;
        case GGML_TYPE_Q5_0: return matvec_q8_kernel<GGML_TYPE_Q5_0, 1>;
        case GGML_TYPE_Q8_0: return matvec_q8_kernel<GGML_TYPE_Q8_0, 1>;
        case GGML_TYPE_Q4_K: return matvec_q8_kernel<GGML_TYPE_Q4_K, 1>;
        case GGML_TYPE_Q6_K: return matvec_q8_kernel<GGML_TYPE_Q6_K, 1>;
        default: return matvec_q8_kernel<kAnyType, 1>;
    }
}

// Whether the block kernel's Q6_K build is the one unrolled by two (64 registers, 4 blocks an SM; else 40 and
// 6): wherever a lane has a second chunk (K > 2048).  Where it has one, the rolled build's higher occupancy wins.
bool q6k_unrolled(const MatvecArgs& a) { return a.K >= 8192 || chunks_a_lane(a.K) >= 2; }

BlockKernel block_kernel_build(const MatvecArgs& a) {
    const int t = launch_type(a);
    const bool long_rows = a.K >= 8192;
    switch (t) {
        case GGML_TYPE_Q4_0: return matvec_q8_block_kernel<GGML_TYPE_Q4_0, 0>;
        case GGML_TYPE_Q5_0: return matvec_q8_block_kernel<GGML_TYPE_Q5_0, 0>;
        case GGML_TYPE_Q8_0: return matvec_q8_block_kernel<GGML_TYPE_Q8_0, 0>;
        case GGML_TYPE_Q4_K: return long_rows ? matvec_q8_block_kernel<GGML_TYPE_Q4_K, 2> : matvec_q8_block_kernel<GGML_TYPE_Q4_K, 0>;
        case GGML_TYPE_Q6_K: return q6k_unrolled(a) ? matvec_q8_block_kernel<GGML_TYPE_Q6_K, 2> : matvec_q8_block_kernel<GGML_TYPE_Q6_K, 1>;
        default: return matvec_q8_block_kernel<kAnyType, 0>;
    }
}

// Whether the block kernel stages its rows in shared memory (stage_block_rows), and the bytes it needs: the
// copies are whole 16-byte pieces, so every part's rows must start 16-byte aligned (W aligned, rb % 4 == 0
// with 4 or 8 rows a region), and 8 rows (+ 16 bytes: the packed types' word loads read up to 4 bytes past a
// field) must fit the 48 KB a launch gets without opting in.  By rule, rows are staged before the PDL wait where
// a block's rows take at most 12 KB: six blocks an SM then hold 72 KB of shared memory and leave L1 most of its
// 256 KB for x; larger blocks measured slower staged.  The kernel choice cuda.matvec_stage forces off or
// before (tests); *forced says it did.
int block_stage(const MatvecArgs& a, size_t* bytes, bool* forced) {
    const std::string v = forced_kernel("cuda.matvec_stage");
    *forced = !v.empty();
    int mode = v == "off" ? kStageOff : v == "before" ? kStageBeforeWait : -1;
    int64_t rb_max = 0;
    for (int p = 0; p < weight_parts(a); p++) {
        if (a.part[p].rb % 4 || uintptr_t(a.part[p].W) % 16) return kStageOff;
        rb_max = std::max(rb_max, a.part[p].rb);
    }
    *bytes = size_t(kBlockRows * rb_max + 16);
    if (mode < 0) mode = *bytes <= 12 * 1024 ? kStageBeforeWait : kStageOff;
    return mode != kStageOff && *bytes <= 48 * 1024 ? mode : kStageOff;
}

// Whether matvec_q8_stream_kernel takes a launch the block kernel would, and how far ahead it loads (0: it does
// not).  It can take one part of Q4_K or Q6_K rows (no swiglu, one activation row); the rule gives it the launches
// of many rows (more groups of 8 than 8 waves of blocks: vocabulary projections) so short that a lane has one
// chunk of each (K <= 2048): there the block kernel's blocks each make one round trip for 52 bytes a lane, where
// the stream keeps the next row's chunk in flight.  Where lanes have two chunks or more, the block kernel
// unrolled by two has two chunks in flight and measured faster -- except for Q6_K rows of two chunks a lane,
// which the chunk layout (q6k_layout.cuh) keeps in 48 bytes of registers.  Ahead: 2 chunks for Q4_K, 1 for Q6_K.
// The kernel choices cuda.matvec_stream (0: never; only: wherever it can run, an error elsewhere) and
// cuda.stream_ahead force it (tests).
int stream_ahead(const MatvecArgs& a, int64_t groups) {
    const uint32_t t = a.part[0].type;
    const bool can = a.n_rows == 1 && !a.swiglu && a.n_parts == 1 && (t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q6_K);
    const int per_lane = chunks_a_lane(a.K);
    bool take = can && groups > 8 * 4 * int64_t(sm_count()) &&
                (per_lane == 1 || (t == GGML_TYPE_Q6_K && per_lane == 2));
    const std::string v = forced_kernel("cuda.matvec_stream");
    if (v == "0") take = false;
    if (v == "only") {
        if (!can)
            throw MinferError("cuda.matvec_stream=only: this launch is not one part of Q4_K or Q6_K rows times one "
                              "activation row");
        take = true;
    }
    if (!take) return 0;
    if (t == GGML_TYPE_Q6_K) return 1;
    return forced_kernel("cuda.stream_ahead") == "1" ? 1 : 2;
}

// How many blocks of a matvec build (32 * kMatvecWarps threads, smem bytes of dynamic shared memory) an SM holds:
// asked of the runtime once a build and size, so a decode graph's capture asks nothing.
int blocks_per_sm(const void* kernel, size_t smem) {
    static std::mutex mu;
    static std::map<std::pair<const void*, size_t>, int> known;
    std::lock_guard<std::mutex> lock(mu);
    auto it = known.find({kernel, smem});
    if (it != known.end()) return it->second;
    int n = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 32 * kMatvecWarps, smem);
    if (e != cudaSuccess || n < 1)
        throw MinferError(strfmt("CUDA matvec_q8: no occupancy for a matvec build (%s)", cudaGetErrorString(e)));
    known[{kernel, smem}] = n;
    return n;
}

// A launch of the block kernel unrolled by two (Q4_K and Q6_K rows of 8192 and more; Q6_K rows of 2048 < K <
// 8192) may deal its rows evenly to whole waves of blocks -- as many waves as its 8 rows a block take, each
// full -- instead of 8 a block, which leaves the last wave part-full.  The same lanes and sums a row: the same
// bits.  Built as separate kernels (SPREAD), so the default builds' code is unchanged.  By rule, launches of at
// least half a wave of blocks are spread (each block keeps 4-8 rows; smaller launches spread to ~3 rows a block
// measured slower); the pipe kernel has no spread build (spreading it measured slower).  The kernel choice
// cuda.matvec_spread forces 0 (never), 1 (wherever it can) or only (as 1, and an error for a launch it cannot
// spread: how tests show it ran).
enum SpreadMode { kSpreadOff, kSpreadAuto, kSpreadOn, kSpreadOnly };
SpreadMode spread_mode() {
    const std::string v = forced_kernel("cuda.matvec_spread");
    return v == "0" ? kSpreadOff : v == "1" ? kSpreadOn : v == "only" ? kSpreadOnly : kSpreadAuto;
}

// A launch whose kernel has no spread build: =only says so (how the tests show that a launch was spread).
void no_spread_build(SpreadMode mode) {
    if (mode == kSpreadOnly) throw MinferError("cuda.matvec_spread=only: this launch's kernel has no spread build");
}

// spread: the launch's spread build or null.  Returns the grid, or 0: not spread.
int64_t spread_grid(MatvecArgs& a, const void* spread, size_t smem, int64_t grid) {
    const SpreadMode mode = spread_mode();
    if (mode == kSpreadOff) return 0;
    const bool only = mode == kSpreadOnly;
    if (!spread || a.rope.pos) {
        no_spread_build(mode);
        return 0;
    }
    const int per_sm = blocks_per_sm(spread, smem);
    int64_t rows = 0;  // rows, or with swiglu gate/up pairs
    if (a.swiglu) rows = a.part[0].n_out;
    else
        for (int p = 0; p < a.n_parts; p++) rows += a.part[p].n_out;
    const int64_t wave = int64_t(per_sm) * sm_count();
    const int64_t blocks = std::min((grid + wave - 1) / wave * wave, rows);  // >= grid: at most 8 rows a block
    if (blocks == grid) {
        if (only)
            throw MinferError(strfmt("cuda.matvec_spread=only: %lld blocks are whole waves of %lld already",
                                     (long long)grid, (long long)wave));
        return 0;
    }
    if (mode == kSpreadAuto && 2 * grid < wave) return 0;
    a.spread_q = rows / blocks;
    a.spread_r = rows % blocks;
    return blocks;
}

// The spread builds of the block kernel (spread_grid), or null for a build that has none.
BlockKernel block_kernel_spread(BlockKernel k) {
    if (k == matvec_q8_block_kernel<GGML_TYPE_Q6_K, 2>) return matvec_q8_block_kernel<GGML_TYPE_Q6_K, 2, true>;
    if (k == matvec_q8_block_kernel<GGML_TYPE_Q4_K, 2>) return matvec_q8_block_kernel<GGML_TYPE_Q4_K, 2, true>;
    return nullptr;
}

// The stream kernel's build and its grid: one wave of blocks (as many as fit an SM, times the SMs), or one block
// a group where there are fewer groups.
void launch_stream(const MatvecArgs& a, const XQ& x, int ahead, int64_t groups, cudaStream_t s) {
    using Kernel = void (*)(MatvecArgs, XQ);
    const bool q6 = a.part[0].type == GGML_TYPE_Q6_K;
    const Kernel k = q6           ? matvec_q8_stream_kernel<GGML_TYPE_Q6_K, 1>
                     : ahead == 2 ? matvec_q8_stream_kernel<GGML_TYPE_Q4_K, 2>
                                  : matvec_q8_stream_kernel<GGML_TYPE_Q4_K, 1>;
    const int64_t grid = std::min<int64_t>(groups, int64_t(blocks_per_sm((const void*)k, 0)) * sm_count());
    launch("matvec_q8_stream", k, dim3(unsigned(grid)), dim3(32 * kMatvecWarps), 0, s, a, x);
}

// Which kernel takes one activation row: the block kernel for K-quant rows of K >= 1024, the warp-per-row
// one otherwise.  On shorter rows the block's idle lane slots and block-wide reduction cost more than the
// shared x saves, and Q8_0 rows (a chunk is 32 values: four lanes cover 136 bytes of a row, loaded as unaligned
// words) measured slower in the block kernel.  The kernel choice cuda.matvec forces warp or block (tests).
bool block_kernel_for(const MatvecArgs& a) {
    if (a.n_rows != 1) return false;
    const std::string v = forced_kernel("cuda.matvec");
    if (!v.empty()) return v == "block";
    for (int p = 0; p < weight_parts(a); p++)
        if (a.part[p].type != GGML_TYPE_Q4_K && a.part[p].type != GGML_TYPE_Q6_K) return false;
    return a.K >= 1024;
}

// The rows kernel's build for a launch of kMatvecQ8MaxRows activation rows.
MatvecKernel rows_kernel_build(const MatvecArgs& a) {
    constexpr int NR = kMatvecQ8MaxRows;
    const int t = launch_type(a);
    return t == GGML_TYPE_Q4_K   ? matvec_q8_rows_kernel<GGML_TYPE_Q4_K, NR>
           : t == GGML_TYPE_Q6_K ? matvec_q8_rows_kernel<GGML_TYPE_Q6_K, NR>
                                 : matvec_q8_rows_kernel<kAnyType, NR>;
}

}  // namespace

// Two activation rows take the rows kernel where the one-row launch would take the block kernel's layout (Q4_K
// and Q6_K rows of K >= 1024); the kernel choice cuda.matvec=warp keeps them on the warp kernel (tests).  Only
// two: each further row costs the kernel about half a one-row launch (its x loads and dot products), so that
// from three rows the int8 tensor cores (gemm_q8, flat in rows up to 8) are faster.
bool matvec_q8_rows_fits(uint32_t type, int64_t rows, int64_t K) {
    if (rows != kMatvecQ8MaxRows || forced_kernel("cuda.matvec") == "warp") return false;
    return (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K) && K >= 1024 && K % 64 == 0;
}

namespace {

bool rows_kernel_for(const MatvecArgs& a) {
    for (int p = 0; p < weight_parts(a); p++)
        if (!matvec_q8_rows_fits(a.part[p].type, a.n_rows, a.K)) return false;
    return true;
}

}  // namespace

bool matvec_q8_supported(uint32_t type, int64_t K) {
    const bool t = type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q8_0 ||
                   type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
    return t && K % 64 == 0;
}

Q8Act q8_act(void* scratch, int rows, int64_t K) {
    int8_t* q = (int8_t*)scratch;
    return Q8Act{q, (float2*)(q + (size_t(rows) * size_t(K) + 15) / 16 * 16)};
}

// The pipe kernel's launches, with parts q, k and v of whole heads (head_dim % 8: 4 pairs a block), every dim
// rotated, an f16 or f32 cache (a q8_0 row block spans 32 dims: other blocks' rows), one activation row.
bool matvec_q8_rope_fusable(const MatvecArgs& a) {
    const QkvRopeEpilogue& e = a.rope;
    if (a.n_rows != 1 || a.swiglu || a.n_parts != 3 || e.head_dim <= 0 || e.head_dim % 8 || e.rope_dim != e.head_dim)
        return false;
    if (e.kv_type != GGML_TYPE_F16 && e.kv_type != GGML_TYPE_F32) return false;
    const int64_t kv = a.part[1].n_out;
    if (a.part[0].n_out % e.head_dim || kv % e.head_dim || a.part[2].n_out != kv || a.part[0].y_col != 0 ||
        a.part[1].y_col != a.part[0].n_out || a.part[2].y_col != a.part[0].n_out + kv)
        return false;
    for (int p = 0; p < 3; p++)
        if (!matvec_q8_supported(a.part[p].type, a.K)) return false;
    if (!block_kernel_for(a)) return false;
    size_t smem = 0;
    bool forced = false;
    const int stage = block_stage(a, &smem, &forced);
    return !(forced && stage != kStageOff) && pipe_kernel_for(a);
}

size_t matvec_q8_scratch_bytes(int rows, int64_t K) {
    return size_t(rows) * size_t(K) + size_t(rows) * size_t(K / 32) * sizeof(float2) + 16;
}

void quantize_q8(const float* x, int64_t ldx, int rows, int64_t K, Q8Act q8, cudaStream_t s) {
    if (K % 32) throw MinferError(strfmt("CUDA quantize_q8: width %lld is not a multiple of 32", (long long)K));
    launch("quantize_x", quantize_x_kernel, dim3(unsigned((K / 32 + 7) / 8), unsigned(rows)), dim3(256), 0, s, x, ldx, K,
           q8.q, q8.ds);
}

void matvec_q8(const MatvecArgs& a, void* scratch, bool quantized, cudaStream_t s) {
    const bool rows_kernel = rows_kernel_for(a);
    if (a.n_rows < 1 || a.n_rows > kMatvecMaxRows || a.K % 64)
        throw MinferError(strfmt("CUDA matvec_q8: %d rows of width %lld (1..%d rows; width a multiple of 64)", a.n_rows,
                                 (long long)a.K, kMatvecMaxRows));
    int64_t rows = 0;
    if (a.swiglu) rows = a.part[0].n_out;
    else
        for (int p = 0; p < a.n_parts; p++) rows += a.part[p].n_out;
    for (int p = 0; p < weight_parts(a); p++)
        if (!matvec_q8_supported(a.part[p].type, a.K))
            throw MinferError(strfmt("CUDA matvec_q8: weight type %u has no 8-bit-activation kernel", a.part[p].type));
    const Q8Act x = q8_act(scratch, a.n_rows, a.K);
    if (!quantized) quantize_q8(a.x, a.ldx, a.n_rows, a.K, x, s);
    const XQ xq{x.q, x.ds, a.K};
    if (a.rope.pos) {
        if (!matvec_q8_rope_fusable(a))
            throw MinferError("CUDA matvec_q8: this launch cannot rotate q and k and store the KV rows itself");
        const unsigned blocks = unsigned(rows / kBlockRows);
        launch("matvec_q8_rope", pipe_kernel<true>(pipe_ahead(blocks, a.K)), dim3(blocks), dim3(32 * kMatvecWarps),
               size_t(a.K + a.K / 4), s, a, xq);
        return;
    }
    if (rows_kernel) {
        const int64_t per_block = a.swiglu ? kBlockRows / 2 : kBlockRows;
        launch("matvec_q8_rows", rows_kernel_build(a), dim3(unsigned((rows + per_block - 1) / per_block)),
               dim3(32 * kMatvecWarps), 0, s, a, xq);
    } else if (block_kernel_for(a)) {
        const int per_block = a.swiglu ? kBlockRows / 2 : kBlockRows;
        size_t smem = 0;
        bool forced = false;
        const int stage = block_stage(a, &smem, &forced);
        const dim3 grid(unsigned((rows + per_block - 1) / per_block));
        if (const int ahead = forced && stage != kStageOff ? 0 : stream_ahead(a, grid.x))
            launch_stream(a, xq, ahead, grid.x, s);
        else if (!(forced && stage != kStageOff) && pipe_kernel_for(a)) {  // where it applies, in place of staging
            no_spread_build(spread_mode());
            const int ahead = pipe_ahead(grid.x, a.K);
            launch("matvec_q8", pipe_kernel<false>(ahead), grid, dim3(32 * kMatvecWarps), size_t(a.K + a.K / 4), s, a,
                   xq);
        } else {
            const BlockKernel k = block_kernel_build(a);
            MatvecArgs b = a;
            const BlockKernel sk = stage == kStageOff ? block_kernel_spread(k) : nullptr;  // staged blocks keep 8 rows
            if (const int64_t g = spread_grid(b, (const void*)sk, 0, grid.x))
                launch("matvec_q8", sk, dim3(unsigned(g)), dim3(32 * kMatvecWarps), 0, s, b, xq, stage);
            else
                launch("matvec_q8", k, grid, dim3(32 * kMatvecWarps), stage == kStageOff ? 0 : smem, s, a, xq, stage);
        }
    } else {
        launch("matvec_q8", warp_kernel_build(a),
               dim3(unsigned((rows + kMatvecWarps - 1) / kMatvecWarps)), dim3(32 * kMatvecWarps), 0, s, a, xq);
    }
}

}  // namespace minfer::cuda
