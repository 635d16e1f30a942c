// What a kernel boundary costs in a replayed decode graph, with and without programmatic dependent launch
// (PDL: the backend's launch() in csrc/backends/cuda/common.cuh).  Three measurements (CUDA_NOTES run 49):
//   1. does a PDL kernel start before its predecessor ends, in a stream and inside a captured graph?
//   2. a chain of 300 dependent kernels of 132 / 528 / 2112 blocks: microseconds a link, plain launches,
//      PDL with the wait first (the backend's order), PDL with launch_dependents first;
//   3. a small kernel alternating with one streaming 16 MB (from DRAM: the copies rotate over 1.6 GB), PDL
//      on every launch, on the small ones only, on the streaming ones only.
// Built and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/pdl_probe benchmarks/pdl_probe.cu && /tmp/pdl_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                  \
    do {                                                                       \
        const cudaError_t ck_err = (x);                                        \
        if (ck_err != cudaSuccess) {                                           \
            std::printf("%s: %s\n", #x, cudaGetErrorString(ck_err));           \
            return 1;                                                          \
        }                                                                      \
    } while (0)

__device__ __forceinline__ uint64_t now() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void dep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void dep_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// ORDER 0: no PDL instructions; 1: wait, then release (the backend's pdl_start); 2: release, then wait.
template <int ORDER>
__device__ __forceinline__ void boundary() {
    if (ORDER == 1) dep_wait(), dep_release();
    if (ORDER == 2) dep_release(), dep_wait();
}

__global__ void spinner(uint64_t ns, uint64_t* end) {
    boundary<1>();
    const uint64_t t0 = now();
    while (now() - t0 < ns) {
    }
    if (threadIdx.x == 0) *end = now();
}

__global__ void starter(uint64_t* start, uint64_t* left_wait) {
    const uint64_t t = now();
    boundary<1>();
    if (threadIdx.x == 0) start[blockIdx.x] = t, left_wait[blockIdx.x] = now();
}

// One link of a dependent chain: each thread reads one value the previous link wrote.
template <int ORDER>
__global__ void link(const float* in, float* out, int n) {
    boundary<ORDER>();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[(i * 7) % n] * 0.5f + 1.0f;
}

// A matvec-like link: streams `per` float4 a thread, then depends on the previous link like link().
template <int ORDER>
__global__ void stream_link(const float4* __restrict__ w, int per, const float* in, float* out, int n) {
    boundary<ORDER>();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    float acc = 0.0f;
    for (int k = 0; k < per; k++) {
        const float4 v = w[int64_t(k) * stride + i];
        acc += v.x + v.y + v.z + v.w;
    }
    if (i < n) out[i] = acc + in[(i * 7) % n];
}

template <typename K, typename... A>
cudaError_t launch(bool pdl, K kernel, dim3 grid, dim3 block, cudaStream_t s, A... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid, c.blockDim = block, c.stream = s, c.attrs = attr, c.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&c, kernel, args...);
}

// Median over 12 replays of a graph recorded by `record`, in microseconds.
template <typename F>
float replay_us(cudaStream_t s, F record) {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    record();
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ex, g, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::vector<float> t;
    for (int r = 0; r < 12; r++) {
        cudaEventRecord(e0, s), cudaGraphLaunch(ex, s), cudaEventRecord(e1, s), cudaStreamSynchronize(s);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 1000.0f);
    }
    cudaGraphExecDestroy(ex), cudaGraphDestroy(g);
    std::sort(t.begin(), t.end());
    return t[6];
}

int main() {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));

    // 1. start of a PDL kernel against the end of a 20 us predecessor
    constexpr int kStarters = 264;
    uint64_t *end, *start, *left;
    CK(cudaMalloc(&end, 8));
    CK(cudaMalloc(&start, 8 * kStarters));
    CK(cudaMalloc(&left, 8 * kStarters));
    for (int graph = 0; graph < 2; graph++)
        for (int pdl = 0; pdl < 2; pdl++) {
            auto pair = [&] {
                launch(false, spinner, dim3(1), dim3(32), s, uint64_t(20000), end);
                launch(pdl == 1, starter, dim3(kStarters), dim3(128), s, start, left);
            };
            if (graph) replay_us(s, pair);
            else pair();
            CK(cudaStreamSynchronize(s));
            uint64_t e = 0, st[kStarters], lw[kStarters];
            CK(cudaMemcpy(&e, end, 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(st, start, sizeof st, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(lw, left, sizeof lw, cudaMemcpyDeviceToHost));
            std::printf("%s, PDL %s: first block started %+lld ns after the predecessor ended, left its wait %+lld ns after\n",
                        graph ? "graph " : "stream", pdl ? "on " : "off",
                        (long long)(*std::min_element(st, st + kStarters) - e),
                        (long long)(*std::min_element(lw, lw + kStarters) - e));
        }

    // 2. chains of dependent links
    constexpr int kLinks = 300, kMaxBlocks = 2112;
    const int n = kMaxBlocks * 256;
    float *a, *b;
    CK(cudaMalloc(&a, n * 4));
    CK(cudaMalloc(&b, n * 4));
    CK(cudaMemset(a, 0, n * 4));
    CK(cudaMemset(b, 0, n * 4));
    const char* order_name[] = {"plain", "PDL, wait first", "PDL, release first"};
    for (int blocks : {132, 528, kMaxBlocks})
        for (int order = 0; order < 3; order++) {
            const float us = replay_us(s, [&] {
                for (int i = 0; i < kLinks; i++) {
                    const float* in = i & 1 ? b : a;
                    float* out = i & 1 ? a : b;
                    auto k = order == 0 ? link<0> : order == 1 ? link<1> : link<2>;
                    launch(order > 0, k, dim3(blocks), dim3(256), s, in, out, blocks * 256);
                }
            });
            std::printf("chain of %d links, %4d blocks, %-18s %.2f us a link\n", kLinks, blocks, order_name[order],
                        us / kLinks);
        }

    // 3. a small kernel alternating with a 16 MB streaming one
    const int per = 16 * 1024 * 1024 / (kMaxBlocks * 256 * 16);
    const size_t copy = size_t(kMaxBlocks) * 256 * per, copies = 100;
    float4* w;
    CK(cudaMalloc(&w, copy * copies * 16));
    CK(cudaMemset(w, 0, copy * copies * 16));
    const char* where[] = {"no launch", "every launch", "small ones", "streaming ones"};
    for (int order = 1; order <= 2; order++)
        for (int on = 0; on < 4; on++) {
            const float us = replay_us(s, [&] {
                for (int i = 0; i < kLinks; i++) {
                    const float* in = i & 1 ? b : a;
                    float* out = i & 1 ? a : b;
                    const bool small = i % 2 == 0;
                    const bool pdl = on == 1 || (on == 2 && small) || (on == 3 && !small);
                    if (small)
                        launch(pdl, order == 1 ? link<1> : link<2>, dim3(132), dim3(256), s, in, out, 132 * 256);
                    else
                        launch(pdl, order == 1 ? stream_link<1> : stream_link<2>, dim3(kMaxBlocks), dim3(256), s,
                               (const float4*)(w + (i / 2 % copies) * copy), per, in, out, kMaxBlocks * 256);
                }
            });
            std::printf("small + 16 MB stream (%s), PDL on %-14s %.2f us a pair\n", order_name[order], where[on],
                        us / (kLinks / 2));
        }
    CK(cudaGetLastError());
    return 0;
}
