// The device's streaming-read ceiling at decode's matrix sizes: how fast can one kernel read N bytes of weights
// from DRAM (each timed call takes the next of enough copies to overflow the L2, as matvec_probe.cu does)?
// Decode's matvecs are judged against this, not against the copy rate (which counts a write per read).
//   ld:    a grid-stride loop of 16-byte loads, four in flight a thread (B blocks of 256 threads)
//   ring:  persistent blocks (one or two an SM) streaming 16 KB tiles through a ring of S shared-memory
//          stages with cp.async, as a weight-streaming matvec would
// Built and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/read_roof benchmarks/read_roof.cu && /tmp/read_roof
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

__global__ void ld_kernel(const uint4* __restrict__ p, int64_t n, unsigned* out) {
    uint32_t acc = 0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n; i += stride) acc ^= p[i].x;
    if (acc == 0x12345678u) out[0] = acc;  // keeps the loads; practically never true
}

constexpr int kTile = 16 * 1024;

__device__ __forceinline__ void cp16(void* smem, const void* g) {
    const unsigned s = unsigned(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g));
}

template <int S>
__global__ void __launch_bounds__(256) ring_kernel(const uint8_t* __restrict__ p, int64_t tiles, unsigned* out) {
    extern __shared__ __align__(16) uint8_t ring[];
    uint32_t acc = 0;
    auto issue = [&](int64_t t, int slot) {
        if (t < tiles)
            for (int o = threadIdx.x * 16; o < kTile; o += 256 * 16) cp16(ring + slot * kTile + o, p + t * kTile + o);
        asm volatile("cp.async.commit_group;");
    };
    int64_t t = blockIdx.x;
    for (int s = 0; s < S - 1; s++) issue(t + int64_t(s) * gridDim.x, s);
    for (int it = 0; t < tiles; t += gridDim.x, it++) {
        issue(t + int64_t(S - 1) * gridDim.x, (it + S - 1) % S);
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1));
        __syncthreads();
        const uint4* r = (const uint4*)(ring + (it % S) * kTile);
        for (int o = threadIdx.x; o < kTile / 16; o += 256) acc ^= r[o].x;
        __syncthreads();
    }
    if (acc == 0x12345678u) out[0] = acc;
}

}  // namespace

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    unsigned* out;
    cudaMalloc(&out, 4);
    for (const int64_t mb : {7, 38, 76, 447}) {
        const int64_t bytes = mb * 1000 * 1000 / kTile * kTile;
        const int copies = int(std::max<int64_t>(3, (800ll << 20) / bytes));
        uint8_t* W;
        if (cudaMalloc(&W, bytes * copies) != cudaSuccess) return printf("cudaMalloc failed\n"), 1;
        cudaMemset(W, 0x5a, bytes * copies);
        auto timeit = [&](const char* name, auto launch) {
            std::vector<float> t;
            for (int rep = 0; rep < 9; rep++) {
                cudaEventRecord(e0);
                for (int i = 0; i < 20; i++) launch(W + ((rep * 20 + i) % copies) * bytes);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                t.push_back(ms / 20);
            }
            std::sort(t.begin(), t.end());
            printf("%4lld MB %-22s %8.1f us %7.0f GB/s\n", (long long)mb, name, t[4] * 1e3, bytes / (t[4] * 1e-3) / 1e9);
        };
        char label[64];
        for (const int per_sm : {4, 8, 16}) {
            snprintf(label, sizeof label, "ld %d blocks/SM", per_sm);
            timeit(label, [&](const uint8_t* w) { ld_kernel<<<sms * per_sm, 256>>>((const uint4*)w, bytes / 16, out); });
        }
        const int64_t tiles = bytes / kTile;
        for (const int per_sm : {1, 2, 4}) {
            snprintf(label, sizeof label, "ring S=3 %d/SM", per_sm);
            cudaFuncSetAttribute(ring_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * kTile);
            timeit(label, [&](const uint8_t* w) { ring_kernel<3><<<sms * per_sm, 256, 3 * kTile>>>(w, tiles, out); });
            snprintf(label, sizeof label, "ring S=6 %d/SM", per_sm);
            cudaFuncSetAttribute(ring_kernel<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * kTile);
            if (per_sm <= 2)
                timeit(label, [&](const uint8_t* w) { ring_kernel<6><<<sms * per_sm, 256, 6 * kTile>>>(w, tiles, out); });
        }
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) printf("CUDA error %s\n", cudaGetErrorString(e));
        cudaFree(W);
    }
    return 0;
}
