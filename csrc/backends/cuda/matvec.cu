// Decode's matrix-vector products: one warp per output row, each lane
// dequantizing 8 weights at a time (dequant8) and dotting them with up to
// kMatvecMaxRows activation rows held in the same loop, so the weights --
// the bytes that bound decode -- are read once per step whatever the row count.
#include "backends/cuda/dequant.cuh"
#include "backends/cuda/kernels.h"

namespace minfer::cuda {

namespace {

constexpr int kWarps = 4;

template <int T>
__global__ void matvec_kernel(const uint8_t* __restrict__ W, int64_t N, int64_t K, int64_t rb,
                              const float* __restrict__ x, int64_t ldx, int n_rows, float* __restrict__ y,
                              int64_t ldy, const float* __restrict__ bias) {
    const int lane = threadIdx.x & 31;
    const int64_t o = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (o >= N) return;  // whole warp leaves together; no block-wide barrier below
    const uint8_t* row = W + o * rb;
    float acc[kMatvecMaxRows];
#pragma unroll
    for (int r = 0; r < kMatvecMaxRows; r++) acc[r] = 0.0f;
    for (int64_t c = lane; c < K / 8; c += 32) {
        float w[8];
        dequant8<T>(row, c * 8, w);
#pragma unroll
        for (int r = 0; r < kMatvecMaxRows; r++) {
            if (r < n_rows) {
                const float* xr = x + r * ldx + c * 8;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) s += w[i] * xr[i];
                acc[r] += s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kMatvecMaxRows; r++) {
        if (r < n_rows) {
            float v = warp_sum(acc[r]);
            if (lane == 0) y[r * ldy + o] = v + (bias ? bias[o] : 0.0f);
        }
    }
}

}  // namespace

bool type_supported(uint32_t type) {
    switch (type) {
#define X(t) case t:
        MINFER_CUDA_TYPES(X)
#undef X
        return true;
        default: return false;
    }
}

int64_t row_bytes(uint32_t type, int64_t cols) {
    switch (type) {
#define X(t) case t: return cols / Block<t>::values * Block<t>::bytes;
        MINFER_CUDA_TYPES(X)
#undef X
        default: throw MinferError(strfmt("CUDA: weight type %u is not supported", type));
    }
}

void matvec(uint32_t wtype, const uint8_t* W, int64_t N, int64_t K, const float* x, int64_t ldx, int n_rows,
            float* y, int64_t ldy, const float* bias, cudaStream_t s) {
    if (n_rows < 1 || n_rows > kMatvecMaxRows || K % 8)
        throw MinferError(strfmt("CUDA matvec: %d rows of width %lld (at most %d rows, width a multiple of 8)", n_rows,
                                 (long long)K, kMatvecMaxRows));
    const dim3 grid(unsigned((N + kWarps - 1) / kWarps)), block(32 * kWarps);
    const int64_t rb = row_bytes(wtype, K);
    switch (wtype) {
#define X(t) case t: matvec_kernel<t><<<grid, block, 0, s>>>(W, N, K, rb, x, ldx, n_rows, y, ldy, bias); break;
        MINFER_CUDA_TYPES(X)
#undef X
        default: throw MinferError(strfmt("CUDA matvec: weight type %u is not supported", wtype));
    }
    check_launch("matvec");
}

}  // namespace minfer::cuda
