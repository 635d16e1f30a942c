// The decode matvec kernels for one activation row (matvec_q8.cu, included whole) at the real layouts' shapes,
// on weights that come from DRAM as in a decode step: each timed call takes the next of enough copies of the
// matrix to overflow the 50 MB L2 (bench_cuda.py --kernels repeats one matrix, which the L2 holds for the
// smaller shapes).  "warp" forces the warp-per-row kernel (MINFER_CUDA_MV=warp), "block" the rule among the
// block and pipe kernels (MINFER_CUDA_MV=block), "ahead old" the same with the pipe kernel's rule before its
// whole-row build (MINFER_CUDA_MV_AHEAD=old), "spread" the rule with MINFER_CUDA_MV_SPREAD=1 (every other row:
// 0); "max diff" is the distance from the warp kernel's result (sums in another order).  Earlier variants
// (staging, MINFER_CUDA_MV_PIPE=all) are levers still: see CUDA_NOTES.
// PROBE_SHAPES=<substring> runs only the shapes whose names contain it.  Built and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 --expt-relaxed-constexpr -Icsrc -o /tmp/matvec_probe \
//        benchmarks/matvec_probe.cu csrc/backends/cuda/matvec.cu csrc/common/error.cpp csrc/quant/types.cpp &&
//        /tmp/matvec_probe
#include "backends/cuda/matvec_q8.cu"
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <random>
#include <algorithm>

using namespace minfer;
using namespace minfer::cuda;

int main() {
    struct Shape { const char* name; uint32_t type; int64_t N, K; };
    Shape shapes[] = {{"q4k gate 18944x3584", GGML_TYPE_Q4_K, 18944, 3584}, {"q4k down 3584x18944", GGML_TYPE_Q4_K, 3584, 18944},
                      {"q6k down 3584x18944", GGML_TYPE_Q6_K, 3584, 18944}, {"q6k vocab 152064x3584", GGML_TYPE_Q6_K, 152064, 3584},
                      {"q4k 1.5b up 8960x1536", GGML_TYPE_Q4_K, 8960, 1536}, {"q6k 1.5b down 1536x8960", GGML_TYPE_Q6_K, 1536, 8960},
                      {"q6k 1.5b vocab 151936x1536", GGML_TYPE_Q6_K, 151936, 1536}, {"q8_0 0.5b vocab 151936x896", GGML_TYPE_Q8_0, 151936, 896},
                      {"q4k qkv 4608x3584", GGML_TYPE_Q4_K, 4608, 3584}, {"q4k O 3584x3584", GGML_TYPE_Q4_K, 3584, 3584}, {"q8_0 gate 18944x3584", GGML_TYPE_Q8_0, 18944, 3584},
                      {"q8_0 down 3584x18944", GGML_TYPE_Q8_0, 3584, 18944}};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::mt19937 rng(1);
    const char* only = getenv("PROBE_SHAPES");  // a substring of the shapes' names to run (all when unset)
    for (auto& S : shapes) {
        if (only && *only && !strstr(S.name, only)) continue;
        const int bb = type_traits(S.type).type_size;
        const int64_t packed_bytes = S.N * int64_t(row_size(S.type, S.K));  // the file's rows
        const int64_t rb = row_bytes(S.type, S.K), bytes = S.N * rb;        // the device's (Q6_K's padded)
        const int copies = int(std::max<int64_t>(3, (600ll << 20) / bytes));
        std::vector<uint8_t> packed(packed_bytes), h(bytes + 64);
        for (auto& v : packed) v = uint8_t(rng());
        const size_t doff = S.type == GGML_TYPE_Q6_K ? offsetof(block_q6_K, d) : 0;  // the f16 scale(s) of each block
        for (int64_t b = 0; b < packed_bytes; b += bb) {
            uint16_t d = 0x1c00 | (rng() & 0x3ff), m = 0x1c00 | (rng() & 0x3ff);
            memcpy(&packed[b + doff], &d, 2);
            if (S.type == GGML_TYPE_Q4_K) memcpy(&packed[b + offsetof(block_q4_K, dmin)], &m, 2);
        }
        lay_rows(S.type, packed.data(), h.data(), S.N, S.K);  // as the upload lays them
        uint8_t* W; cudaMalloc(&W, bytes * copies + 64);
        for (int c = 0; c < copies; c++) cudaMemcpy(W + c * bytes, h.data(), bytes, cudaMemcpyHostToDevice);
        const size_t sb = matvec_q8_scratch_bytes(1, S.K);
        std::vector<uint8_t> hs(sb);
        Q8Act hx = q8_act(hs.data(), 1, S.K);
        for (int64_t i = 0; i < S.K; i++) hx.q[i] = int8_t(rng() % 255 - 127);
        for (int64_t i = 0; i < S.K / 32; i++) hx.ds[i] = make_float2(0.01f + (rng() % 100) * 1e-4f, 0.3f);
        void* scratch; cudaMalloc(&scratch, sb);
        cudaMemcpy(scratch, hs.data(), sb, cudaMemcpyHostToDevice);
        float *y, *y0; cudaMalloc(&y, S.N * 4); cudaMalloc(&y0, S.N * 4);
        auto args = [&](const uint8_t* w, float* yy) {
            MatvecArgs a;
            a.part[0].W = w; a.part[0].rb = rb; a.part[0].type = S.type; a.part[0].n_out = S.N;
            a.n_parts = 1; a.K = S.K; a.n_rows = 1; a.y = yy; a.ldy = S.N;
            return a;
        };
        auto timeit = [&](const char* name, auto launch) {
            launch(W, y);
            cudaDeviceSynchronize();
            std::vector<float> a(S.N), b(S.N);
            cudaMemcpy(a.data(), y, S.N * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(b.data(), y0, S.N * 4, cudaMemcpyDeviceToHost);
            double md = 0, mx = 0;
            for (int64_t i = 0; i < S.N; i++) md = std::max(md, double(fabsf(a[i] - b[i]))), mx = std::max(mx, double(fabsf(b[i])));
            std::vector<float> t;
            for (int rep = 0; rep < 9; rep++) {
                cudaEventRecord(e0);
                for (int i = 0; i < 20; i++) launch(W + ((rep * 20 + i) % copies) * bytes, y);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float ms; cudaEventElapsedTime(&ms, e0, e1);
                t.push_back(ms / 20);
            }
            std::sort(t.begin(), t.end());
            printf("%-28s %-10s %8.1f us %7.0f GB/s  (max diff %.2g of %.2g)\n", S.name, name, t[4] * 1e3,
                   bytes / (t[4] * 1e-3) / 1e9, md, mx);
        };
        setenv("MINFER_CUDA_MV_SPREAD", "0", 1);
        setenv("MINFER_CUDA_MV", "warp", 1);
        matvec_q8(args(W, y0), scratch, true, 0);
        timeit("warp", [&](const uint8_t* w, float* yy) { matvec_q8(args(w, yy), scratch, true, 0); });
        setenv("MINFER_CUDA_MV", "block", 1);
        timeit("block", [&](const uint8_t* w, float* yy) { matvec_q8(args(w, yy), scratch, true, 0); });
        // the pipe kernel's rule before the whole-row build (one chunk ahead, or two for launches of one wave)
        setenv("MINFER_CUDA_MV_AHEAD", "old", 1);
        timeit("ahead old", [&](const uint8_t* w, float* yy) { matvec_q8(args(w, yy), scratch, true, 0); });
        unsetenv("MINFER_CUDA_MV_AHEAD");
        // the block kernel where the rule takes the stream kernel (vocabularies of short rows), and the stream
        // kernel forced onto every shape it can take (Q4_K: one chunk ahead as well as the rule's two)
        setenv("MINFER_CUDA_MV_STREAM", "0", 1);
        timeit("stream 0", [&](const uint8_t* w, float* yy) { matvec_q8(args(w, yy), scratch, true, 0); });
        if (S.type == GGML_TYPE_Q4_K || S.type == GGML_TYPE_Q6_K) {
            setenv("MINFER_CUDA_MV_STREAM", "only", 1);
            timeit("stream", [&](const uint8_t* w, float* yy) { matvec_q8(args(w, yy), scratch, true, 0); });
            if (S.type == GGML_TYPE_Q4_K) {
                setenv("MINFER_CUDA_MV_STREAM_AHEAD", "1", 1);
                timeit("stream a1", [&](const uint8_t* w, float* yy) { matvec_q8(args(w, yy), scratch, true, 0); });
                unsetenv("MINFER_CUDA_MV_STREAM_AHEAD");
            }
        }
        unsetenv("MINFER_CUDA_MV_STREAM");
        // the unrolled block kernel's rows dealt evenly to whole waves of blocks (the 7B's downs)
        setenv("MINFER_CUDA_MV_SPREAD", "1", 1);
        timeit("spread", [&](const uint8_t* w, float* yy) { matvec_q8(args(w, yy), scratch, true, 0); });
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) printf("CUDA error %s\n", cudaGetErrorString(e));
        cudaFree(W); cudaFree(scratch); cudaFree(y); cudaFree(y0);
    }
    return 0;
}
