// A kernel timeline of a CUDA program, replayed graphs included, through CUPTI's activity API.
// Nsight Systems is not on the lent machines; this is the part of it the decode work needs: when
// each kernel started and ended on the GPU, so the gaps and overlaps between the ~340 kernels of a
// replayed decode step can be read (ncu times kernels one at a time, with graphs off).
//
//   T=/usr/local/cuda/targets/x86_64-linux   # where the toolkit keeps cupti.h and libcupti.so (the H200's)
//   nvcc -O2 -shared -Xcompiler -fPIC benchmarks/cuda_timeline.cpp -o /tmp/libtimeline.so -I$T/include -L$T/lib -lcupti
//   CUDA_TIMELINE_CSV=/tmp/t.csv LD_LIBRARY_PATH=$T/lib LD_PRELOAD=/tmp/libtimeline.so python3 ...
//
// The CSV has one row per kernel: start and end (ns, GPU clock), graph id, correlation id (one per
// launch; a graph's kernels share the graph launch's), grid and block sizes, and the mangled name.
// The program calls `minfer_timeline_flush()` (ctypes) before it exits, while its CUDA context is alive;
// `profile_cuda.py --timeline` drives it and summarizes a decode step.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
    uint64_t start, end;
    uint32_t graph, corr;
    int grid, block;
    std::string name;
};

std::mutex rows_mu;
std::vector<Row>* rows = nullptr;
constexpr size_t kBuffer = 8 << 20;

void CUPTIAPI requested(uint8_t** buf, size_t* size, size_t* max_records) {
    *buf = static_cast<uint8_t*>(aligned_alloc(8, kBuffer));
    *size = kBuffer;
    *max_records = 0;
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
    CUpti_Activity* rec = nullptr;
    std::lock_guard<std::mutex> lock(rows_mu);
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        rows->push_back(Row{k->start, k->end, k->graphId, k->correlationId, k->gridX * k->gridY * k->gridZ,
                            k->blockX * k->blockY * k->blockZ, k->name ? k->name : "?"});
    }
    free(buf);
}

struct Tracer {
    Tracer() {
        if (!getenv("CUDA_TIMELINE_CSV")) return;
        rows = new std::vector<Row>();  // leaked: CUPTI may still call back while statics are destroyed
        if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
            cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
            fprintf(stderr, "cuda_timeline: CUPTI refused the kernel activity\n");
    }
};

}  // namespace

extern "C" void minfer_timeline_flush() {
    static bool done = false;
    const char* path = getenv("CUDA_TIMELINE_CSV");
    if (!path || done) return;
    done = true;
    cuptiActivityFlushAll(1);
    FILE* f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "start,end,graph,corr,grid,block,name\n");
    std::lock_guard<std::mutex> lock(rows_mu);
    for (const Row& r : *rows)
        fprintf(f, "%llu,%llu,%u,%u,%d,%d,%s\n", (unsigned long long)r.start, (unsigned long long)r.end, r.graph,
                r.corr, r.grid, r.block, r.name.c_str());
    fclose(f);
}

// Enables the activity as the library loads (LD_PRELOAD: before the program makes its CUDA context).
static Tracer tracer;
