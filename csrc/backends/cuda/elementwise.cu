// Elementwise ops over row windows, row copies (TailRow) and the embedding
// gather.  In place is safe for all of them: each thread reads its elements
// before writing the same ones.  Reference: tests/test_cuda.py (test_elementwise, test_getrows_and_tailrow).
#include <algorithm>
#include <climits>

#include "backends/cuda/dequant.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_act.cuh"

namespace minfer::cuda {

namespace {

__global__ void elementwise_kernel(Ew op, const float* __restrict__ a, int64_t lda, const float* __restrict__ b,
                                   int64_t ldb, float* y, int64_t ldy, int cols, float scale, MmaAct xb) {
    pdl_start();
    const int r = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const float x = a[int64_t(r) * lda + c];
    float v;
    switch (op) {
        case Ew::Add: v = x + b[int64_t(r) * ldb + c]; break;
        case Ew::Mul: v = x * b[int64_t(r) * ldb + c]; break;
        case Ew::Silu: v = silu(x); break;
        case Ew::SwiGLU: v = silu(x) * b[int64_t(r) * ldb + c]; break;
        case Ew::Gelu: v = gelu(x); break;
        case Ew::GeGLU: v = gelu(x) * b[int64_t(r) * ldb + c]; break;
        case Ew::Scale: v = x * scale; break;
        default: v = scale * tanhf(x / scale); break;  // SoftCap
    }
    y[int64_t(r) * ldy + c] = v;
    if (xb.p) mma_act_store((__nv_bfloat16*)xb.p, xb.rows, r, c, v);
}

template <int T>
__global__ void get_rows_kernel(const uint8_t* __restrict__ W, int64_t n_rows_w, int64_t K, int64_t rb,
                                const int32_t* __restrict__ ids, float* __restrict__ y, int64_t ldy, uint32_t* err) {
    pdl_wait_then_release();  // a step's first kernel
    const int r = blockIdx.y;
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= K / 8) return;
    const int32_t id = ids[r];
    float w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (id < 0 || id >= n_rows_w) {
        if (c == 0) atomicOr(err, kBadTokenId);
    } else {
        dequant8<T>(W + int64_t(id) * rb, c * 8, w);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) y[int64_t(r) * ldy + c * 8 + i] = w[i];
}

// Block b of row y = blockIdx.y scans x[y ldx + b * chunk, ... + chunk) (index j, or ids[y ldx + j] in the
// second pass), then (value, index) pairs are reduced keeping the larger value and, on ties, the smaller index
// (NaN never wins).  The block's best goes to pv/pi[y gridDim.x + b], or, in a one-block pass, the token to
// out[y].  Rows are independent: a batch's rows are one launch (two with the second pass), not two each.
__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

// A chained step's row r: its winner becomes the next step's token at the next position (kernels.h, ArgmaxFeed).
__device__ __forceinline__ void feed_next(const ArgmaxFeed& f, int r, int win) {
    f.token[r] = win;
    f.result[r] = win;
    const int p = ++f.pos[r];
    if (!f.slot) return;
    const int b = p / f.block_size, at = p % f.block_size;  // past the table: a step the chain does not run
    const int64_t t = int64_t(r) * f.max_blocks + b;
    f.slot[r] = b < f.max_blocks ? f.tables[t] * f.block_size + at : -1;
}

__global__ void argmax_kernel(const float* __restrict__ x, const int* __restrict__ ids, int n, int64_t ldx, int chunk,
                              float* pv, int* pi, int* out, uint32_t* err, ArgmaxFeed feed,
                              const uint32_t* __restrict__ allow, int64_t ld_allow) {
    pdl_start();
    __shared__ float sv[32];
    __shared__ int si[32];
    const int64_t row = blockIdx.y;
    x += row * ldx;
    if (ids) ids += row * ldx;
    if (allow) allow += row * ld_allow;
    if (pv) pv += row * gridDim.x, pi += row * gridDim.x;
    if (out) out += row;
    const int first = blockIdx.x * chunk, last = min(n, first + chunk);
    float v = -INFINITY;
    int i = INT_MAX;
    bool nan = false;
    for (int j = first + threadIdx.x; j < last; j += blockDim.x) {
        const float xj = x[j];
        nan |= xj != xj;
        if (allow && !((allow[j >> 5] >> (j & 31)) & 1u)) continue;  // a token the constraint rules out
        better(v, i, xj, ids ? ids[j] : j);
    }
    if (err && __syncthreads_or(nan) && threadIdx.x == 0) atomicOr(err, kNanLogit);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = i;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? sv[threadIdx.x] : -INFINITY;
        i = threadIdx.x < blockDim.x / 32 ? si[threadIdx.x] : INT_MAX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
        if (threadIdx.x == 0) {
            if (!out) {
                pv[blockIdx.x] = v, pi[blockIdx.x] = i;
            } else {
                const int win = i != INT_MAX ? i : 0;  // all -inf: token 0, as a scan would pick
                *out = win;
                if (feed.token) feed_next(feed, int(row), win);
            }
        }
    }
}

__global__ void pick_rows_kernel(const float* __restrict__ x, int64_t ldx, int x_rows, const int32_t* __restrict__ idx,
                                 float* __restrict__ y, int64_t ldy, int cols, uint32_t* err) {
    pdl_start();  // x is the kernel before's output (launched as a dependent, this must wait for it)
    const int r = blockIdx.y, i = idx[r];
    if (i < 0 || i >= x_rows) {
        if (threadIdx.x == 0 && blockIdx.x == 0) atomicOr(err, kBadPosition);
        return;
    }
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
        y[int64_t(r) * ldy + c] = x[int64_t(i) * ldx + c];
}

}  // namespace

void pick_rows(const float* x, int64_t ldx, int x_rows, const int32_t* idx, float* y, int64_t ldy, int rows, int cols,
               uint32_t* err, cudaStream_t s) {
    launch("pick_rows", pick_rows_kernel, dim3(unsigned((cols + 255) / 256), unsigned(rows)), dim3(256), 0, s, x, ldx,
           x_rows, idx, y, ldy, cols, err);
}

namespace {
// Two passes over a vocabulary (one block would scan 150k logits alone): blocks of `chunk` values, then one block
// over their winners; as many rows a launch pair as their partials fit the kArgmaxBlocks of scratch.
void argmax_launch(const float* x, int64_t ldx, int n, int rows, int* out, void* partial, uint32_t* err, cudaStream_t s,
                   ArgmaxFeed feed, const uint32_t* allow, int64_t ld_allow) {
    const int chunk = std::max(4096, (n + kArgmaxBlocks - 1) / kArgmaxBlocks), blocks = (n + chunk - 1) / chunk;
    float* pv = (float*)partial;
    int* pi = (int*)(pv + kArgmaxBlocks);
    for (int r = 0, per = kArgmaxBlocks / blocks; r < rows; r += per) {
        const int m = std::min(per, rows - r);
        const float* xr = x + int64_t(r) * ldx;
        const uint32_t* ar = allow ? allow + int64_t(r) * ld_allow : nullptr;
        ArgmaxFeed fr = feed;  // this launch's rows start at row r
        if (fr.token) {
            fr.token += r, fr.pos += r, fr.result += r;
            if (fr.slot) fr.slot += r, fr.tables += int64_t(r) * fr.max_blocks;
        }
        if (blocks == 1) {
            launch("argmax", argmax_kernel, dim3(1, unsigned(m)), dim3(1024), 0, s, xr, (const int*)nullptr, n, ldx, n,
                   (float*)nullptr, (int*)nullptr, out + r, err, fr, ar, ld_allow);
            continue;
        }
        launch("argmax", argmax_kernel, dim3(unsigned(blocks), unsigned(m)), dim3(1024), 0, s, xr, (const int*)nullptr,
               n, ldx, chunk, pv, pi, (int*)nullptr, err, ArgmaxFeed{}, ar, ld_allow);
        launch("argmax_final", argmax_kernel, dim3(1, unsigned(m)), dim3(1024), 0, s, (const float*)pv, (const int*)pi,
               blocks, int64_t(blocks), blocks, (float*)nullptr, (int*)nullptr, out + r, (uint32_t*)nullptr, fr,
               (const uint32_t*)nullptr, int64_t(0));
    }
}
}  // namespace

void argmax(const float* x, int n, int* out, void* partial, uint32_t* err, cudaStream_t s, const uint32_t* allow) {
    argmax_launch(x, n, n, 1, out, partial, err, s, ArgmaxFeed{}, allow, 0);
}

void argmax_rows(const float* x, int64_t ldx, int n, int rows, int* out, void* partial, uint32_t* err, cudaStream_t s,
                 const uint32_t* allow, int64_t ld_allow) {
    argmax_launch(x, ldx, n, rows, out, partial, err, s, ArgmaxFeed{}, allow, ld_allow);
}

void argmax_rows_feed(const float* x, int64_t ldx, int n, int rows, const ArgmaxFeed& feed, void* partial,
                      uint32_t* err, cudaStream_t s) {
    argmax_launch(x, ldx, n, rows, feed.result, partial, err, s, feed, nullptr, 0);
}

void elementwise(Ew op, const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int rows,
                 int cols, cudaStream_t s, float scale, MmaAct xb) {
    check_mma_act("elementwise", xb, rows, cols);
    launch("elementwise", elementwise_kernel, dim3(unsigned((cols + 255) / 256), unsigned(rows)), dim3(256), 0, s, op, a,
           lda, b, ldb, y, ldy, cols, scale, xb);
}

void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int rows, int cols, cudaStream_t s) {
    cudaError_t e = cudaMemcpy2DAsync(y, size_t(ldy) * 4, x, size_t(ldx) * 4, size_t(cols) * 4, size_t(rows),
                                      cudaMemcpyDeviceToDevice, s);
    if (e != cudaSuccess) throw MinferError(strfmt("CUDA: copying rows failed: %s", cudaGetErrorString(e)));
}

void get_rows(uint32_t wtype, const uint8_t* W, int64_t n_rows_w, int64_t K, const int32_t* ids, int rows, float* y,
              int64_t ldy, uint32_t* err, cudaStream_t s) {
    if (K % 8) throw MinferError(strfmt("CUDA get_rows: width %lld is not a multiple of 8", (long long)K));
    const dim3 grid(unsigned((K / 8 + 127) / 128), unsigned(rows));
    const int64_t rb = row_bytes(wtype, K);
    switch (wtype) {
#define X(t) case t: return launch("get_rows", get_rows_kernel<t>, grid, dim3(128), 0, s, W, n_rows_w, K, rb, ids, y, ldy, err);
        MINFER_CUDA_TYPES(X)
#undef X
        default: throw MinferError(strfmt("CUDA get_rows: weight type %u is not supported", wtype));
    }
}

}  // namespace minfer::cuda
