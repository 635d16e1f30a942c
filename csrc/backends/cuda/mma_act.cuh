// The bf16 layout of gemm_mma's activations, shared by mma_act (gemm_mma.cu) and the kernels whose output a
// batch step's product reads next (add_rmsnorm, SwiGLU): they write it beside their f32 output, so the product
// needs no conversion launch of its own.  Row r's value k (of `rows` rows) lies at element
// ((k / kMmaChunk) rows + r) kMmaChunkStride / 2 + k % kMmaChunk -- a 128-value chunk's rows contiguous, one
// bulk copy -- and each 4 values in the order 0 2 1 3 (an m16n8k16 fragment's pairs).
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

namespace minfer::cuda {

constexpr int kMmaChunk = 128, kMmaChunkStride = 2 * kMmaChunk + 64;  // bytes a chunk's row (64 of them padding)

__device__ __forceinline__ int64_t mma_act_at(int64_t k, int r, int rows) {
    return ((k / kMmaChunk) * rows + r) * (kMmaChunkStride / 2) + k % kMmaChunk;
}

// Value k of row r.
__device__ __forceinline__ void mma_act_store(__nv_bfloat16* out, int rows, int r, int64_t k, float v) {
    const int j = int(k & 3);
    out[mma_act_at(k & ~int64_t(3), r, rows) + (j == 1 ? 2 : j == 2 ? 1 : j)] = __float2bfloat16_rn(v);
}

// Values k..k+3 of row r (k % 4 == 0): one 8-byte store.
__device__ __forceinline__ void mma_act_store4(__nv_bfloat16* out, int rows, int r, int64_t k, float4 v) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.z), hi = __floats2bfloat162_rn(v.y, v.w);
    uint2 o;
    o.x = *(const uint32_t*)&lo;
    o.y = *(const uint32_t*)&hi;
    *(uint2*)(out + mma_act_at(k, r, rows)) = o;
}

}  // namespace minfer::cuda
