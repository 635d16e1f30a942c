// What the batch products (gemm_q8.cu, gemm_mma.cu) share: shared-memory stages filled by the copy engine (a
// stage's rows each arrive by one bulk copy, cp.async.bulk, counted on the stage's mbarrier, and the warps wait
// on the barrier's phase before they read the stage); the K slice a weight type streams in and the token tiles
// a row count takes; and the table of kernel builds by (weight type, tiles).
#pragma once
#include <cstdint>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "quant/types.h"

namespace minfer::cuda {

__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void init_stage_barrier(uint64_t* bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
}
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// This thread arrives on `bar` expecting `bytes` more, which the copies it issues next will bring.
__device__ __forceinline__ void expect_bytes(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// One bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) counted on `bar`.
__device__ __forceinline__ void bulk_copy_only(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// Both: this thread's one copy into the stage.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    expect_bytes(bar, bytes);
    bulk_copy_only(dst, src, bytes, bar);
}

__device__ __forceinline__ void wait_phase(uint64_t* bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
}

__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *(const uint32_t*)p; }

// The values a stage holds of one weight row: a K-quant super-block, or four Q8_0 blocks (0: no batch product).
inline int batch_slice(uint32_t type) {
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K ? 256 : type == GGML_TYPE_Q8_0 ? 128 : 0;
}

// Tiles of 8 tokens a block takes for M activation rows (every row in one block).
inline int batch_tiles(int M) { return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8; }

// A kernel build and the dynamic shared memory its stages take.
template <typename Kernel> struct BatchKernel {
    Kernel kernel;
    size_t smem;
};

// Build<T, NT>::kernel and ::smem for the weight type and tile count, its shared memory allowed once per process.
template <template <int, int> class Build> auto batch_kernel(uint32_t type, int nt, const char* name) {
    using K = std::remove_const_t<decltype(Build<GGML_TYPE_Q4_K, 1>::kernel)>;
    auto built = [name](auto t, auto n) {
        constexpr int T = decltype(t)::value, NT = decltype(n)::value;
        static const BatchKernel<K> b = [name] {
            const BatchKernel<K> k{Build<T, NT>::kernel, Build<T, NT>::smem};
            const cudaError_t e = cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       int(k.smem));
            if (e != cudaSuccess)
                throw MinferError(strfmt("CUDA %s: a block cannot have %zu bytes of shared memory: %s", name, k.smem,
                                         cudaGetErrorString(e)));
            return k;
        }();
        return b;
    };
    auto by_tiles = [&](auto t) {
        switch (nt) {
            case 1: return built(t, std::integral_constant<int, 1>{});
            case 2: return built(t, std::integral_constant<int, 2>{});
            case 4: return built(t, std::integral_constant<int, 4>{});
            default: return built(t, std::integral_constant<int, 8>{});
        }
    };
    switch (type) {
        case GGML_TYPE_Q4_K: return by_tiles(std::integral_constant<int, GGML_TYPE_Q4_K>{});
        case GGML_TYPE_Q6_K: return by_tiles(std::integral_constant<int, GGML_TYPE_Q6_K>{});
        default: return by_tiles(std::integral_constant<int, GGML_TYPE_Q8_0>{});
    }
}

}  // namespace minfer::cuda
