// Per-row ops before attention: RMSNorm (whole row, or per head for qwen3's
// QkNorm), rotary embedding at each row's position, and the KV store that
// writes k and v rows into the cache at their positions (f32, f16 or q8_0
// blocks, byte-compatible with csrc/backends/kv_format.cpp).  Reference: the reference backend;
// tests/test_cuda.py (test_rmsnorm, test_rope, test_rope_kv_store_matches_unfused, test_add_rmsnorm).
#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/kernel_choice.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_act.cuh"
#include "backends/cuda/matvec_rows.cuh"
#include "backends/cuda/rope.cuh"
#include "quant/types.h"

namespace minfer::cuda {

namespace {

constexpr int kAddNormPer = 16;  // values per thread of add_rmsnorm: rows up to 16384

// One block per (row, group); an f32 sum of squares (tree-reduced, so its
// error grows with log(width)), checked against the float64 reference in tests.
__global__ void rmsnorm_kernel(const float* x, int64_t ldx, float* y, int64_t ldy,  // may run in place
                               int width, const float* __restrict__ w, float eps) {
    pdl_start();
    __shared__ float scratch[32];
    const float* xr = x + int64_t(blockIdx.x) * ldx + int64_t(blockIdx.y) * width;
    float* yr = y + int64_t(blockIdx.x) * ldy + int64_t(blockIdx.y) * width;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / float(width) + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// The residual add fused with the next RMSNorm: the sum s = a + b goes to
// y[:, :cols] and s / rms(s) * w to y[:, cols:].  Value k of a thread is column
// threadIdx.x + k * blockDim.x; block (x, row) writes the values k in
// [x * per, (x + 1) * per).  Decode spreads a row over cols / blockDim blocks
// (per = 1), each of which sums the whole row's squares itself: a wide, short
// kernel instead of one SM walking the row.  Prefill takes one block per row.
// With q8.q, the norm is also rounded to 8-bit blocks of 32 for the decode
// matvec that reads it (quantize_lane, as quantize_x does).
__global__ void __launch_bounds__(1024) add_rmsnorm_kernel(const float* a, int64_t lda, const float* b, int64_t ldb,
                                                           float* y, int64_t ldy, int cols, int per,
                                                           const float* __restrict__ w, float eps, Q8Act q8) {
    const int row = blockIdx.y, k0 = blockIdx.x * per;
    float wv[kAddNormPer];  // the norm weights are no kernel's output: read before waiting on the one before
#pragma unroll
    for (int k = 0; k < kAddNormPer; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        wv[k] = k >= k0 && k < k0 + per && i < cols ? w[i] : 0.0f;
    }
    pdl_start();
    __shared__ float scratch[32];
    const float* ar = a + int64_t(row) * lda;
    const float* br = b + int64_t(row) * ldb;
    float* sr = y + int64_t(row) * ldy;
    float v[kAddNormPer];  // every load of the row in flight at once, values kept in registers
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kAddNormPer; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = i < cols ? ar[i] + br[i] : 0.0f;
        ss += v[k] * v[k];
    }
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / float(cols) + eps);
#pragma unroll
    for (int k = 0; k < kAddNormPer; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (k < k0 || k >= k0 + per || i >= cols) continue;  // whole warps: cols % 32 == 0 when q8 is asked for
        const float x = v[k] * scale * wv[k];
        sr[i] = v[k];
        sr[cols + i] = x;
        if (q8.q)
            quantize_lane(x, q8.q + int64_t(row) * cols + i, q8.ds + int64_t(row) * (cols / 32) + i / 32);
    }
}

// Decode's add + RMSNorm (rows <= 4; cols % 32 == 0, at most 4096; rows 16-byte aligned): four values per
// thread as float4, every load of the row in flight at once (a quarter of add_rmsnorm_kernel's load
// instructions); block x of a row writes float4s [256 x, 256 x + 256) and sums the whole row's squares
// itself.  The 8-bit activations come from quantize_lane4 (the same bytes as quantize_lane).  With b null
// it is decode's plain RmsNorm (the first layer's): y[:, :cols] = RmsNorm(a), no sum window.  A batch step's
// norm before a gemm_mma product (up to 64 rows) takes it too, writing the norm in that product's layout (xb).
constexpr int kNormF4 = 4;  // float4s per thread: 4 * 256 * 4 = 4096 values

// WAIT_FIRST: the kernel waits for the one before it before it lets the next one launch (add_norm_kernel's rule).
template <bool WAIT_FIRST>
__global__ void __launch_bounds__(256) add_rmsnorm_f4_kernel(const float* a, int64_t lda, const float* b, int64_t ldb,
                                                             float* y, int64_t ldy, int cols,
                                                             const float* __restrict__ w, float eps, Q8Act q8,
                                                             MmaAct xb) {
    const int row = blockIdx.y, n4 = cols / 4, f = blockIdx.x * 256 + threadIdx.x;
    const bool mine = f < n4;
    const float4 wv = mine ? ((const float4*)w)[f] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // no kernel's output
    if constexpr (WAIT_FIRST) pdl_wait_then_release();
    else pdl_start();
    __shared__ float scratch[32];
    const float4* ar = (const float4*)(a + int64_t(row) * lda);
    const float4* br = (const float4*)(b + int64_t(row) * ldb);
    float4 v[kNormF4];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormF4; j++) {
        const int i = j * 256 + threadIdx.x;
        v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n4) {
            const float4 x = ar[i], z = b ? br[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[j] = make_float4(x.x + z.x, x.y + z.y, x.z + z.z, x.w + z.w);
        }
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / float(cols) + eps);
    float4 sv = v[0];  // this block's float4: iteration blockIdx.x (selected, not indexed: stays in registers)
#pragma unroll
    for (int j = 1; j < kNormF4; j++)
        if (j == int(blockIdx.x)) sv = v[j];
    const float4 xv = make_float4(sv.x * scale * wv.x, sv.y * scale * wv.y, sv.z * scale * wv.z, sv.w * scale * wv.w);
    float* yr = y + int64_t(row) * ldy;
    if (mine && b) {
        ((float4*)yr)[f] = sv;
        ((float4*)(yr + cols))[f] = xv;
    } else if (mine) {
        ((float4*)yr)[f] = xv;
    }
    if (q8.q) quantize_lane4(xv, mine, q8.q + int64_t(row) * cols + 4 * f, q8.ds + int64_t(row) * (cols / 32) + f / 8);
    if (xb.p && mine) mma_act_store4((__nv_bfloat16*)xb.p, xb.rows, row, 4 * int64_t(f), xv);
}

// Pair i (< head_dim / 2) of a head, x -> y: rotated by the angle (cs, sn) when
// it lies within rope_dim (NeoX pairs dims i and i + rope_dim/2, the original
// layout dims 2i and 2i+1), else the two dims past rope_dim pass through.
__device__ __forceinline__ void rope_pair(const float* xh, float* yh, int i, int rope_dim, bool neox, double cs,
                                          double sn) {
    const int half = rope_dim / 2;
    if (i >= half) {
        const int j = rope_dim + 2 * (i - half);
        yh[j] = xh[j];
        yh[j + 1] = xh[j + 1];
        return;
    }
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    const double x0 = xh[i0], x1 = xh[i1];
    yh[i0] = rope_lo(x0, x1, cs, sn);
    yh[i1] = rope_hi(x0, x1, cs, sn);
}

// One thread per pair.
__global__ void rope_kernel(const float* __restrict__ x, int64_t ldx, float* __restrict__ y, int64_t ldy,
                            const int32_t* __restrict__ pos, int cols, int head_dim, int rope_dim, float base,
                            float scale, bool neox) {
    const int r = blockIdx.y, pairs_per_head = head_dim / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= cols / 2) return;
    const int h = t / pairs_per_head, i = t % pairs_per_head;
    double cs = 1.0, sn = 0.0;
    if (i < rope_dim / 2) rope_angle(pos[r], i, rope_dim, base, scale, &cs, &sn);
    rope_pair(x + int64_t(r) * ldx + int64_t(h) * head_dim, y + int64_t(r) * ldy + int64_t(h) * head_dim, i, rope_dim,
              neox, cs, sn);
}

// Columns [c0, c0 + n) of a k or v row into the cache at position p (src holds
// those n values): f32/f16 copy or q8_0 blocks (amax / 127, round half away
// from zero, as quantize_row_act does; c0 and n multiples of 32); the block's
// threads share the work, one thread per 32 values for q8_0.
__device__ void store_row(uint32_t kv_type, const float* src, uint8_t* dst, int64_t p, int dim, int c0, int n) {
    if (kv_type == GGML_TYPE_F32) {
        float* d = (float*)dst + int64_t(p) * dim + c0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = src[i];
    } else if (kv_type == GGML_TYPE_F16) {
        __half* d = (__half*)dst + int64_t(p) * dim + c0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = __float2half_rn(src[i]);
    } else {
        uint8_t* row = dst + (int64_t(p) * (dim / 32) + c0 / 32) * 34;
        for (int b = threadIdx.x; b < n / 32; b += blockDim.x) {
            const float* xb = src + b * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            uint8_t* blk = row + b * 34;
            *(__half*)blk = __float2half_rn(d);
            for (int j = 0; j < 32; j++) ((int8_t*)blk)[2 + j] = int8_t(roundf(xb[j] * id));
        }
    }
}

// One block per row.
__global__ void kv_store_kernel(uint32_t kv_type, const float* __restrict__ k, int64_t ldk, const float* __restrict__ v,
                                int64_t ldv, const int32_t* __restrict__ pos, int dim, int n_ctx, int ring,
                                uint8_t* K, uint8_t* V, uint32_t* err) {
    const int r = blockIdx.x;
    const int p = pos[r];
    if (p < 0 || p >= n_ctx) {
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        return;
    }
    const int64_t row = kv_cache_row(p, ring);
    store_row(kv_type, k + int64_t(r) * ldk, K, row, dim, 0, dim);
    store_row(kv_type, v + int64_t(r) * ldv, V, row, dim, 0, dim);
}

// The decode fusion of rope(q), rope(k) and the KV store: one block per head
// of a row, a thread per rotated pair.  Blocks [0, q heads) rotate a q head
// into y; the rest rotate a k head (into shared memory: a q8_0 block needs all
// 32 of its rotated values) and store it, with the v head, into the cache.
// The angles depend only on the positions, which are uploaded before the step,
// so they are computed before waiting on the kernel before.  Same arithmetic
// as rope_kernel + kv_store_kernel, so the results are identical.
__global__ void rope_kv_store_kernel(RopeStoreShape sh, const float* q, int64_t ldq,  // q may be y (in place)
                                     const float* __restrict__ k, int64_t ldk, const float* __restrict__ v, int64_t ldv,
                                     const int32_t* __restrict__ pos, const int32_t* __restrict__ rows, float* y,
                                     int64_t ldy, uint8_t* K, uint8_t* V, uint32_t* err) {
    extern __shared__ float kr[];  // the rotated k head
    const int r = blockIdx.y, hb = blockIdx.x, n_q = sh.q_cols / sh.head_dim, i = threadIdx.x;
    const int p = pos[r], at = rows ? rows[r] : p;  // rotated at its position, stored at its (pool) row
    const bool ok = p >= 0 && at >= 0 && at < sh.n_ctx;
    double cs = 1.0, sn = 0.0;
    if (ok && i < sh.rope_dim / 2) rope_angle(p, i, sh.rope_dim, sh.base, sh.scale, &cs, &sn);
    pdl_start();
    if (!ok) {  // uniform over the block: nothing stored, no barrier reached
        if (hb == 0 && i == 0) atomicOr(err, kBadPosition);
        return;
    }
    const bool is_q = hb < n_q;
    const int h = is_q ? hb : hb - n_q;
    const float* xh = (is_q ? q + int64_t(r) * ldq : k + int64_t(r) * ldk) + h * sh.head_dim;
    float* oh = is_q ? y + int64_t(r) * ldy + h * sh.head_dim : kr;
    if (i < sh.head_dim / 2) rope_pair(xh, oh, i, sh.rope_dim, sh.neox, cs, sn);
    if (is_q) return;
    __syncthreads();
    const int64_t row = rows ? int64_t(at) : kv_cache_row(p, sh.ring);
    store_row(sh.kv_type, kr, K, row, sh.kv_dim, h * sh.head_dim, sh.head_dim);
    store_row(sh.kv_type, v + int64_t(r) * ldv + h * sh.head_dim, V, row, sh.kv_dim, h * sh.head_dim, sh.head_dim);
}

}  // namespace

namespace {

bool aligned16(const float* p, int64_t ld) { return uintptr_t(p) % 16 == 0 && ld % 4 == 0; }

// When decode's add + norm lets the next kernel -- a projection whose blocks ask for their weights before their
// own wait -- launch: as it starts (release), or once its own wait is over (wait).  It waits before a q/k/v
// projection of Q4_K rows that the pipe kernel's whole-row build takes (matvec_q8_whole_row: 2048 < K <= 4096):
// that launch asks for every weight byte at once, and released early it competes with the kernels still
// finishing the layer before.  Everywhere else (shorter rows, loaded a chunk ahead; the FFN's projections) the
// early release measured faster.  The kernel choice cuda.norm_pdl forces one behaviour (tests).
void (*add_norm_kernel(bool before_attention, bool q4k, int cols))(const float*, int64_t, const float*, int64_t, float*,
                                                                    int64_t, int, const float*, float, Q8Act, MmaAct) {
    const std::string v = forced_kernel("cuda.norm_pdl");
    bool wait = before_attention && q4k && matvec_q8_whole_row(cols);
    if (!v.empty())
        wait = v == "wait" || (v == "wait-attn" && before_attention) || (v == "wait-ffn" && !before_attention);
    return wait ? add_rmsnorm_f4_kernel<true> : add_rmsnorm_f4_kernel<false>;
}

}  // namespace

bool rmsnorm(const float* x, int64_t ldx, float* y, int64_t ldy, int rows, int cols, int width, const float* w,
             float eps, Q8Act q8, cudaStream_t s) {
    if (width <= 0 || cols % width)
        throw MinferError(strfmt("CUDA rmsnorm: %d columns are not whole groups of %d", cols, width));
    // Decode's whole-row norm (the first layer's): the float4 kernel, which also writes the 8-bit activations.
    // It runs out of place only (its blocks read the whole row before any writes its part).
    if (width == cols && rows <= 4 && cols % 32 == 0 && cols <= 4 * 256 * kNormF4 && aligned16(x, ldx) &&
        aligned16(y, ldy) && aligned16(w, 0) && x != y) {
        launch("rmsnorm", add_rmsnorm_f4_kernel<false>, dim3(unsigned((cols / 4 + 255) / 256), unsigned(rows)),
               dim3(256), 0, s, x, ldx, (const float*)nullptr, int64_t(0), y, ldy, cols, w, eps, q8, MmaAct{});
        return q8.q != nullptr;
    }
    const int threads = width >= 1024 ? 256 : width >= 256 ? 128 : 32;
    launch("rmsnorm", rmsnorm_kernel, dim3(unsigned(rows), unsigned(cols / width)), dim3(threads), 0, s, x, ldx, y, ldy,
           width, w, eps);
    return false;
}

bool add_rmsnorm(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int rows, int cols,
                 const float* w, float eps, Q8Act q8, cudaStream_t s, bool before_attention, bool q4k, MmaAct xb) {
    if (q8.q && cols % 32) throw MinferError(strfmt("CUDA add_rmsnorm: 8-bit blocks need cols %% 32 == 0, got %d", cols));
    check_mma_act("add_rmsnorm", xb, rows, cols);
    if (cols > 1024 * kAddNormPer)
        throw MinferError(strfmt("CUDA add_rmsnorm: rows of %d values (at most %d)", cols, 1024 * kAddNormPer));
    if ((rows <= 4 || xb.p) && cols % 32 == 0 && cols <= 4 * 256 * kNormF4 && aligned16(a, lda) && aligned16(b, ldb) &&
        aligned16(y, ldy) && aligned16(w, 0)) {
        // decode's launch rule; a batch product's weights are asked for before its wait: release at once
        launch("add_rmsnorm", rows <= 4 ? add_norm_kernel(before_attention, q4k, cols) : add_rmsnorm_f4_kernel<false>,
               dim3(unsigned((cols / 4 + 255) / 256), unsigned(rows)), dim3(256), 0, s, a, lda, b, ldb, y, ldy, cols, w,
               eps, q8, xb);
        return xb.p != nullptr;
    }
    // threads: enough that kAddNormPer values each cover the row
    int threads = std::max(rows <= 4 ? 256 : cols >= 1024 ? 256 : 128, (cols + kAddNormPer - 1) / kAddNormPer);
    threads = (threads + 31) / 32 * 32;
    const int slices = (cols + threads - 1) / threads;
    const int per = rows <= 4 ? 1 : slices;  // decode: one block per slice of the row
    launch("add_rmsnorm", add_rmsnorm_kernel, dim3(unsigned(slices / per), unsigned(rows)), dim3(threads), 0, s, a, lda,
           b, ldb, y, ldy, cols, per, w, eps, q8);
    return false;
}

void rope(const float* x, int64_t ldx, float* y, int64_t ldy, const int32_t* pos, int rows, int cols, int head_dim,
          int rope_dim, float base, float scale, bool neox, cudaStream_t s) {
    if (head_dim <= 0 || cols % head_dim || rope_dim > head_dim || rope_dim % 2)
        throw MinferError(strfmt("CUDA rope: cols %d, head_dim %d, rope_dim %d", cols, head_dim, rope_dim));
    const int pairs = cols / 2;
    rope_kernel<<<dim3(unsigned((pairs + 127) / 128), unsigned(rows)), 128, 0, s>>>(x, ldx, y, ldy, pos, cols, head_dim,
                                                                                      rope_dim, base, scale, neox);
    check_launch("rope");
}

void kv_store(uint32_t kv_type, const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* pos, int rows,
              int dim, int n_ctx, int ring, void* K, void* V, uint32_t* err, cudaStream_t s) {
    if (kv_type == GGML_TYPE_Q8_0 && dim % 32)
        throw MinferError(strfmt("CUDA kv_store: q8_0 needs a KV width divisible by 32, got %d", dim));
    kv_store_kernel<<<unsigned(rows), 128, 0, s>>>(kv_type, k, ldk, v, ldv, pos, dim, n_ctx, ring, (uint8_t*)K,
                                                   (uint8_t*)V, err);
    check_launch("kv_store");
}

void rope_kv_store(const RopeStoreShape& sh, const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                   int64_t ldv, const int32_t* pos, const int32_t* rows, float* y, int64_t ldy, void* K, void* V,
                   uint32_t* err, cudaStream_t s) {
    if (sh.head_dim <= 0 || sh.head_dim > 2048 || sh.q_cols % sh.head_dim || sh.kv_dim % sh.head_dim ||
        sh.rope_dim > sh.head_dim || sh.rope_dim % 2 || (sh.kv_type == GGML_TYPE_Q8_0 && sh.head_dim % 32))
        throw MinferError(strfmt("CUDA rope_kv_store: q %d, kv %d columns, head_dim %d, rope_dim %d (%s cache)",
                                 sh.q_cols, sh.kv_dim, sh.head_dim, sh.rope_dim,
                                 sh.kv_type == GGML_TYPE_Q8_0 ? "q8_0: heads of whole 32-blocks" : "f16/f32"));
    const int heads = (sh.q_cols + sh.kv_dim) / sh.head_dim, threads = (sh.head_dim / 2 + 31) / 32 * 32;
    launch("rope_kv_store", rope_kv_store_kernel, dim3(unsigned(heads), unsigned(sh.rows)), dim3(unsigned(threads)),
           size_t(sh.head_dim) * sizeof(float), s, sh, q, ldq, k, ldk, v, ldv, pos, rows, y, ldy, (uint8_t*)K,
           (uint8_t*)V, err);
}

}  // namespace minfer::cuda
