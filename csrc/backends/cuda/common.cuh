// Device-side helpers shared by the CUDA kernels: f16 loads from unaligned
// block fields, warp/block reductions, and the launch-error check.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "common/error.h"

namespace minfer::cuda {

// Every launch is followed by this: a bad configuration is an exception naming
// the kernel, not a silent no-op.
inline void check_launch(const char* kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw MinferError(strfmt("CUDA: launching %s failed: %s", kernel, cudaGetErrorString(e)));
}

// GGUF blocks are packed (18, 22, 34, 210 bytes...): only 2-byte alignment of
// their f16 fields is guaranteed, so read them as 16-bit words.
__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half(*(const uint16_t*)p));
}
__device__ __forceinline__ uint32_t u32_at2(const uint8_t* p) {  // 2-byte aligned 32-bit field
    const uint16_t* h = (const uint16_t*)p;
    return uint32_t(h[0]) | uint32_t(h[1]) << 16;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the total.  `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(t);
}

}  // namespace minfer::cuda
