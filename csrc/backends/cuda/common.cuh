// Device-side helpers shared by the CUDA kernels: f16 loads from unaligned
// block fields, warp/block reductions, and the launch-error check.  Tested through every kernel
// (tests/test_cuda.py, tests/test_cuda_matvec.py).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

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
// The cache row of position p: p, or its row in a local layer's ring of `ring` rows.
__device__ __forceinline__ int64_t kv_cache_row(int p, int ring) { return ring > 0 ? p % ring : p; }

__device__ __forceinline__ uint32_t u32_at2(const uint8_t* p) {  // 2-byte aligned 32-bit field
    const uint16_t* h = (const uint16_t*)p;
    return uint32_t(h[0]) | uint32_t(h[1]) << 16;
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
// GELU, tanh form, as x / (1 + e^(-2z)), z = sqrt(2/pi) (x + 0.044715 x^3): the CPU kernels' arithmetic.
__device__ __forceinline__ float gelu(float x) {
    return x / (1.0f + expf(-1.5957691216f * x * (1.0f + 0.044715f * x * x)));
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

// Programmatic dependent launch (Hopper): a kernel started with launch() may
// begin while the kernel before it on the stream is still finishing, so the
// launch latency between the small kernels of a decode step overlaps work.
// Every such kernel calls pdl_start() before reading what earlier kernels wrote: it
// lets the next kernel begin launching, then waits for the previous kernel to
// complete with its writes visible.  Releasing first puts the next kernel's blocks
// on the SMs while this one still waits (with the attention's early loads, decode
// measured faster); it is safe because that kernel's own wait is for this
// one, which cannot complete before its wait returns.  Devices before compute
// capability 9.0 launch plainly (pdl_enabled).  A kernel may read what no kernel of the step writes (weights, the
// step's token and positions, the KV rows of earlier steps) before pdl_start(), so
// that those reads overlap the kernels before; everything else comes after it.  That
// holds because a step's first kernel waits before it releases the rest
// (pdl_wait_then_release): nothing of the step starts before the previous step's
// kernels -- the device chain's argmax, which writes the token and position -- end.
__device__ __forceinline__ void pdl_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// pdl_start() in the other order, for a step's first kernel (the embedding gather): it releases the next
// kernel only once the kernels before it -- the previous step's, whose argmax writes this step's token and
// position in a device chain -- have completed.  With release first, the step's early kernels could be
// resident, and read the position before their waits (RoPE, attention), while the previous argmax still ran:
// chained greedy tokens went wrong at the third step.
__device__ __forceinline__ void pdl_wait_then_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The device's SM count (once; 132 on an H200), for the launch rules sized to one wave.
inline int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
        return v > 0 ? v : 132;
    }();
    return n;
}

// Programmatic dependent launch (a kernel starts while the one before it finishes) needs compute capability 9.0.
inline bool pdl_enabled() {
    static const bool on = [] {
        int dev = 0, major = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        return major >= 9;
    }();
    return on;
}

// Launches so far by kernel name, this process (cuda_launch_counts: tests see which kernels a step runs; a graph's
// replays launch nothing here).
struct LaunchCounts {
    std::mutex m;
    std::map<std::string, long> n;
};
inline LaunchCounts& launch_counts() {
    static LaunchCounts c;
    return c;
}

// cluster_z > 0: thread-block clusters of (1, 1, cluster_z) blocks (grid.z a multiple of it).
template <typename... P, typename... A>
void launch_in_clusters(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                        unsigned cluster_z, A... args) {
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (pdl_enabled()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = cluster_z;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, P(args)...);
    if (e != cudaSuccess) throw MinferError(strfmt("CUDA: launching %s failed: %s", name, cudaGetErrorString(e)));
    check_launch(name);
    LaunchCounts& c = launch_counts();
    std::lock_guard<std::mutex> lock(c.m);
    c.n[name]++;
}

template <typename... P, typename... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
    launch_in_clusters(name, kernel, grid, block, smem, s, 0u, args...);
}

}  // namespace minfer::cuda
