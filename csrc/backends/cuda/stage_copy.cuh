// Shared-memory stages filled by the copy engine, for the batch products (gemm_q8.cu, gemm_mma.cu): a stage's
// rows each arrive by one bulk copy (cp.async.bulk, one instruction for a whole run of 16-byte multiples)
// counted on the stage's mbarrier, and the warps wait on the barrier's phase before they read the stage.
#pragma once
#include <cstdint>

#include "backends/cuda/common.cuh"

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

}  // namespace minfer::cuda
