// Per-row ops before attention: RMSNorm (whole row, or per head for qwen3's
// QkNorm), rotary embedding at each row's position, and the KV store that
// writes k and v rows into the cache at their positions (f32, f16 or q8_0
// blocks, byte-compatible with csrc/backends/kv_format.cpp).
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "quant/types.h"

namespace minfer::cuda {

namespace {

// One block per (row, group); an f32 sum of squares (tree-reduced, so its
// error grows with log(width)), checked against the float64 reference in tests.
__global__ void rmsnorm_kernel(const float* __restrict__ x, int64_t ldx, float* __restrict__ y, int64_t ldy,
                               int width, const float* __restrict__ w, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + int64_t(blockIdx.x) * ldx + int64_t(blockIdx.y) * width;
    float* yr = y + int64_t(blockIdx.x) * ldy + int64_t(blockIdx.y) * width;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / float(width) + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// One thread per rotated pair.  The angle is computed in double: at position
// 30000 a float angle would be off by ~1e-3 rad.
__global__ void rope_kernel(const float* __restrict__ x, int64_t ldx, float* __restrict__ y, int64_t ldy,
                            const int32_t* __restrict__ pos, int cols, int head_dim, int rope_dim, float base,
                            bool neox) {
    const int r = blockIdx.y;
    const int half = rope_dim / 2, pairs_per_head = head_dim / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= cols / 2) return;
    const int h = t / pairs_per_head, i = t % pairs_per_head;
    const float* xh = x + int64_t(r) * ldx + int64_t(h) * head_dim;
    float* yh = y + int64_t(r) * ldy + int64_t(h) * head_dim;
    if (i >= half) {  // dims past rope_dim pass through, two per thread
        const int j = rope_dim + 2 * (i - half);
        yh[j] = xh[j];
        yh[j + 1] = xh[j + 1];
        return;
    }
    const double theta = double(pos[r]) * pow(double(base), -2.0 * i / rope_dim);
    double sn, cs;
    sincos(theta, &sn, &cs);
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    const double x0 = xh[i0], x1 = xh[i1];
    yh[i0] = float(x0 * cs - x1 * sn);
    yh[i1] = float(x0 * sn + x1 * cs);
}

// One block per row, one thread per 32 values: f32/f16 copy or q8_0 quantization
// (amax / 127, round half away from zero, as quantize_row_act does).
__global__ void kv_store_kernel(uint32_t kv_type, const float* __restrict__ k, int64_t ldk, const float* __restrict__ v,
                                int64_t ldv, const int32_t* __restrict__ pos, int dim, int n_ctx, uint8_t* K,
                                uint8_t* V, uint32_t* err) {
    const int r = blockIdx.x;
    const int p = pos[r];
    if (p < 0 || p >= n_ctx) {
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        return;
    }
    for (int which = 0; which < 2; which++) {
        const float* src = (which ? v + int64_t(r) * ldv : k + int64_t(r) * ldk);
        uint8_t* dst = which ? V : K;
        if (kv_type == GGML_TYPE_F32) {
            float* d = (float*)dst + int64_t(p) * dim;
            for (int i = threadIdx.x; i < dim; i += blockDim.x) d[i] = src[i];
        } else if (kv_type == GGML_TYPE_F16) {
            __half* d = (__half*)dst + int64_t(p) * dim;
            for (int i = threadIdx.x; i < dim; i += blockDim.x) d[i] = __float2half_rn(src[i]);
        } else {
            uint8_t* row = dst + int64_t(p) * (dim / 32) * 34;
            for (int b = threadIdx.x; b < dim / 32; b += blockDim.x) {
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
}

}  // namespace

void rmsnorm(const float* x, int64_t ldx, float* y, int64_t ldy, int rows, int cols, int width, const float* w,
             float eps, cudaStream_t s) {
    if (width <= 0 || cols % width)
        throw MinferError(strfmt("CUDA rmsnorm: %d columns are not whole groups of %d", cols, width));
    const int threads = width >= 1024 ? 256 : width >= 256 ? 128 : 32;
    rmsnorm_kernel<<<dim3(unsigned(rows), unsigned(cols / width)), threads, 0, s>>>(x, ldx, y, ldy, width, w, eps);
    check_launch("rmsnorm");
}

void rope(const float* x, int64_t ldx, float* y, int64_t ldy, const int32_t* pos, int rows, int cols, int head_dim,
          int rope_dim, float base, bool neox, cudaStream_t s) {
    if (head_dim <= 0 || cols % head_dim || rope_dim > head_dim || rope_dim % 2)
        throw MinferError(strfmt("CUDA rope: cols %d, head_dim %d, rope_dim %d", cols, head_dim, rope_dim));
    const int pairs = cols / 2;
    rope_kernel<<<dim3(unsigned((pairs + 127) / 128), unsigned(rows)), 128, 0, s>>>(x, ldx, y, ldy, pos, cols, head_dim,
                                                                                      rope_dim, base, neox);
    check_launch("rope");
}

void kv_store(uint32_t kv_type, const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* pos, int rows,
              int dim, int n_ctx, void* K, void* V, uint32_t* err, cudaStream_t s) {
    if (kv_type == GGML_TYPE_Q8_0 && dim % 32)
        throw MinferError(strfmt("CUDA kv_store: q8_0 needs a KV width divisible by 32, got %d", dim));
    kv_store_kernel<<<unsigned(rows), 128, 0, s>>>(kv_type, k, ldk, v, ldv, pos, dim, n_ctx, (uint8_t*)K, (uint8_t*)V,
                                                   err);
    check_launch("kv_store");
}

}  // namespace minfer::cuda
