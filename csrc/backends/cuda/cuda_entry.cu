// Kernel-level entry points for tests and benchmarks (cuda_matmul, cuda_copy_bandwidth, cuda_argmax): one
// kernel family run on its own, with the backend's bounded waits.  Reference: tests/test_cuda_matvec.py (rung 1).
#include "backends/cuda/cuda_backend.cuh"

namespace minfer {

using namespace cuda_host;

namespace {
// The kernel entry points below (cuda_matmul, cuda_copy_bandwidth) wait as the backend does: by polling an
// event, bounded by MINFER_GPU_TIMEOUT_S.  A wait that times out marks the call hung, and its device memory is
// then left allocated rather than freed (cudaFree would wait for the hung kernel, and an unbounded
// cudaDeviceSynchronize would wait for ever).
struct Waits {
    double timeout_s = gpu_timeout_s();
    bool hung = false;
    // Waits for event ev (recorded by the caller); what: the step, for the error.
    void on(cudaEvent_t ev, const char* what) {
        const cudaError_t e = wait_event(ev, timeout_s);
        if (e == cudaErrorNotReady) {
            hung = true;
            throw MinferError(strfmt("CUDA %s: the GPU did not finish within %g s (MINFER_GPU_TIMEOUT_S)", what,
                                     timeout_s));
        }
        if (e != cudaSuccess) throw MinferError(strfmt("CUDA %s: %s", what, cudaGetErrorString(e)));
    }
};
// Device memory freed on every path out of the entry points, unless their wait timed out (Waits).
struct DevMem {
    void* p = nullptr;
    const Waits& waits;
    DevMem(size_t bytes, const Waits& w) : waits(w) {
        check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "allocating test memory");
    }
    ~DevMem() {
        if (!waits.hung) cudaFree(p);
    }
};
struct Timer {
    cudaEvent_t a, b;
    Timer() { cudaEventCreate(&a); cudaEventCreate(&b); }
    ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
    double seconds(Waits& w) {
        w.on(b, "timing");
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        return ms / 1e3;
    }
};
}  // namespace

std::vector<float> cuda_matmul(uint32_t type, const uint8_t* w, size_t w_bytes, int64_t N, int64_t K, const float* x,
                               int rows, int iters, double* seconds_per_call, const std::string& path) {
    if (!cuda_device_info().available) throw MinferError(cuda_device_info().reason);
    if (!type_supported(type)) throw MinferError(strfmt("CUDA: weight type %s is not supported", type_traits(type).name));
    if (w_bytes != size_t(N) * row_size(type, K))
        throw MinferError(strfmt("cuda_matmul: %zu weight bytes for %lld rows of %lld %s values", w_bytes, (long long)N,
                                 (long long)K, type_traits(type).name));
    // The path the backend would take (auto), or one forced: f32 or q8 matvec (at most kMatvecMaxRows rows), gemm.
    std::string how = path;
    if (how == "auto")
        how = rows > kMatvecMaxRows ? "gemm" : decode_q8() && cuda::matvec_q8_supported(type, K) ? "q8" : "f32";
    if (how != "gemm" && how != "q8" && how != "f32" && how != "mma" && how != "bf16")
        throw MinferError("cuda_matmul: path must be 'auto', 'f32', 'q8', 'mma', 'bf16' or 'gemm', got '" + path + "'");
    if (how == "mma" && !cuda::gemm_q8_fits(type, rows, K))
        throw MinferError(strfmt("cuda_matmul: no int8 tensor-core product for %d rows of %s at width %lld", rows,
                                 type_traits(type).name, (long long)K));
    if (how == "bf16" && !cuda::gemm_mma_fits(type, rows, K))
        throw MinferError(strfmt("cuda_matmul: no bf16 tensor-core product for %d rows of %s at width %lld", rows,
                                 type_traits(type).name, (long long)K));
    if (how != "gemm" && how != "mma" && how != "bf16" && rows > kMatvecMaxRows)
        throw MinferError(strfmt("cuda_matmul: the matvec paths take at most %d rows", kMatvecMaxRows));
    if (how == "q8" && !cuda::matvec_q8_supported(type, K))
        throw MinferError(strfmt("cuda_matmul: no 8-bit-activation matvec for %s at width %lld", type_traits(type).name,
                                 (long long)K));
    const size_t dev_w = size_t(N) * size_t(row_bytes(type, K));  // the upload's layout (lay_rows)
    Waits waits;  // before the memory: it outlives it
    DevMem dw(dev_w + 256, waits), dx(size_t(rows) * K * 4, waits), dy(size_t(rows) * N * 4, waits),
        wh(size_t(N) * K * 2, waits), xh(cuda::mma_act_bytes(rows, K), waits),
        part(size_t(std::max({cuda::gemm_splits(rows, N, K), cuda::gemm_q_splits(rows, N, K),
                              how == "mma" ? cuda::gemm_q8_splits(type, rows, N, K) : 1,
                              how == "bf16" ? cuda::gemm_mma_splits(type, rows, N, K) : 1})) * rows * N * 4,
             waits),
        xq(cuda::matvec_q8_scratch_bytes(rows, K), waits), counters(size_t(cuda::kGemmMmaCounters) * 4, waits);
    check(cudaMemset(counters.p, 0, size_t(cuda::kGemmMmaCounters) * 4), "zeroing the split counters");
    std::vector<uint8_t> laid(dev_w);
    lay_rows(type, w, laid.data(), N, K);
    check(cudaMemcpy(dw.p, laid.data(), dev_w, cudaMemcpyHostToDevice), "uploading");
    check(cudaMemcpy(dx.p, x, size_t(rows) * K * 4, cudaMemcpyHostToDevice), "uploading");
    cudaStream_t s = nullptr;  // the legacy stream: these calls are synchronous anyway
    auto run = [&] {
        if (how == "bf16") {
            cuda::mma_act((const float*)dx.p, K, rows, K, xh.p, s);
            cuda::gemm_mma(type, xh.p, rows, K, (const uint8_t*)dw.p, N, (float*)dy.p, N, nullptr, (float*)part.p,
                           (int*)counters.p, s);
        } else if (how == "mma") {
            const cuda::Q8Act q8 = cuda::q8_act(xq.p, rows, K);
            cuda::quantize_q8((const float*)dx.p, K, rows, K, q8, s);
            cuda::gemm_q8(type, q8, rows, K, (const uint8_t*)dw.p, N, (float*)dy.p, N, nullptr, (float*)part.p, s);
        } else if (how != "gemm") {
            MatvecArgs m;
            m.part[0] = MatvecPart{(const uint8_t*)dw.p, nullptr, row_bytes(type, K), type, N, 0};
            m.K = K;
            m.x = (const float*)dx.p;
            m.ldx = K;
            m.n_rows = rows;
            m.y = (float*)dy.p;
            m.ldy = N;
            if (how == "q8") cuda::matvec_q8(m, xq.p, false, s);
            else cuda::matvec(m, s);
        } else if (cuda::gemm_q_fits(rows, K)) {  // as the backend runs a batch's decode step
            cuda::convert_f16((const float*)dx.p, K, rows, K, (__half*)xh.p, s);
            cuda::gemm_q(type, (const __half*)xh.p, rows, (const uint8_t*)dw.p, N, K, (float*)dy.p, N, nullptr,
                         (float*)part.p, s);
        } else {
            cuda::dequantize_f16(type, (const uint8_t*)dw.p, N, K, (__half*)wh.p, s);
            cuda::convert_f16((const float*)dx.p, K, rows, K, (__half*)xh.p, s);
            cuda::gemm_f16((const __half*)xh.p, (const __half*)wh.p, rows, N, K, (float*)dy.p, N, nullptr,
                           (float*)part.p, s);
        }
    };
    Timer t;
    run();
    check(cudaEventRecord(t.b, s), "recording an event");
    waits.on(t.b, "running the matmul");
    if (iters > 0) {
        cudaEventRecord(t.a, s);
        for (int i = 0; i < iters; i++) run();
        cudaEventRecord(t.b, s);
        *seconds_per_call = t.seconds(waits) / iters;
    }
    std::vector<float> y(size_t(rows) * size_t(N));
    check(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), "reading back");
    return y;
}

std::map<std::string, long> cuda_launch_counts() {
    cuda::LaunchCounts& c = cuda::launch_counts();
    std::lock_guard<std::mutex> lock(c.m);
    return c.n;
}

double cuda_copy_bandwidth(size_t bytes, int iters) {
    if (!cuda_device_info().available) throw MinferError(cuda_device_info().reason);
    Waits waits;
    DevMem a(bytes, waits), b(bytes, waits);
    Timer t;
    check(cudaMemsetAsync(a.p, 1, bytes, nullptr), "filling");
    check(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, nullptr), "warming up");
    check(cudaEventRecord(t.b, nullptr), "recording an event");
    waits.on(t.b, "warming up");
    cudaEventRecord(t.a, nullptr);
    for (int i = 0; i < iters; i++) cudaMemcpyAsync(i % 2 ? a.p : b.p, i % 2 ? b.p : a.p, bytes, cudaMemcpyDeviceToDevice, nullptr);
    cudaEventRecord(t.b, nullptr);
    return 2.0 * double(bytes) * iters / t.seconds(waits);
}

std::vector<int> cuda_argmax(const float* x, int n, int rows, int reps, const uint32_t* allow, bool* nan) {
    if (!cuda_device_info().available) throw MinferError(cuda_device_info().reason);
    if (n < 1 || rows < 1 || reps < 1)
        throw MinferError(strfmt("cuda_argmax: %d rows of %d values, %d runs (at least 1 of each)", rows, n, reps));
    const size_t words = (size_t(n) + 31) / 32;
    Waits waits;
    DevMem dx(size_t(n) * size_t(rows) * 4, waits), part(size_t(cuda::kArgmaxBlocks) * 8, waits),
        out(size_t(reps) * size_t(rows) * 4, waits), err(4, waits), mask(allow ? words * size_t(rows) * 4 : 4, waits);
    cudaStream_t s = nullptr;
    check(cudaMemcpyAsync(dx.p, x, size_t(n) * size_t(rows) * 4, cudaMemcpyHostToDevice, s), "uploading");
    if (allow) check(cudaMemcpyAsync(mask.p, allow, words * size_t(rows) * 4, cudaMemcpyHostToDevice, s), "uploading");
    check(cudaMemsetAsync(err.p, 0, 4, s), "zeroing the error word");
    const uint32_t* m = allow ? (const uint32_t*)mask.p : nullptr;
    for (int i = 0; i < reps; i++)  // one row: the same launches as cuda::argmax (decode's)
        cuda::argmax_rows((const float*)dx.p, n, n, rows, (int*)out.p + size_t(i) * size_t(rows), part.p,
                          (uint32_t*)err.p, s, m, int64_t(words));
    Timer t;
    check(cudaEventRecord(t.b, s), "recording an event");
    waits.on(t.b, "running the argmax");
    std::vector<int> won(size_t(reps) * size_t(rows));
    uint32_t e = 0;
    check(cudaMemcpy(won.data(), out.p, won.size() * 4, cudaMemcpyDeviceToHost), "reading back");
    check(cudaMemcpy(&e, err.p, 4, cudaMemcpyDeviceToHost), "reading back");
    *nan = (e & cuda::kNanLogit) != 0;
    return won;
}

void cuda_top_k(const float* x, int n, int rows, int k, float* vals, int32_t* ids, bool* nan, int iters,
                double* seconds_per_call) {
    if (!cuda_device_info().available) throw MinferError(cuda_device_info().reason);
    if (n < 1 || rows < 1) throw MinferError(strfmt("cuda_top_k: %d rows of %d values (at least 1 of each)", rows, n));
    Waits waits;
    const size_t out = size_t(rows) * size_t(std::max(k, 0));
    DevMem dx(size_t(n) * size_t(rows) * 4, waits), dv(out * 4 + 4, waits), di(out * 4 + 4, waits), err(4, waits),
        part(cuda::top_k_scratch_bytes(n, rows, std::max(k, 1)) + 4, waits);
    cudaStream_t s = nullptr;
    check(cudaMemcpyAsync(dx.p, x, size_t(n) * size_t(rows) * 4, cudaMemcpyHostToDevice, s), "uploading");
    check(cudaMemsetAsync(err.p, 0, 4, s), "zeroing the error word");
    auto run = [&] { cuda::top_k_rows((const float*)dx.p, n, n, rows, k, (float*)dv.p, (int32_t*)di.p, part.p, (uint32_t*)err.p, s); };
    run();
    Timer t;
    check(cudaEventRecord(t.b, s), "recording an event");
    waits.on(t.b, "running the top-k");
    check(cudaMemcpy(vals, dv.p, out * 4, cudaMemcpyDeviceToHost), "reading back");
    check(cudaMemcpy(ids, di.p, out * 4, cudaMemcpyDeviceToHost), "reading back");
    uint32_t e = 0;
    check(cudaMemcpy(&e, err.p, 4, cudaMemcpyDeviceToHost), "reading back");
    *nan = (e & cuda::kNanLogit) != 0;
    if (iters > 0 && seconds_per_call) {
        cudaEventRecord(t.a, s);
        for (int i = 0; i < iters; i++) run();
        cudaEventRecord(t.b, s);
        *seconds_per_call = t.seconds(waits) / iters;
    }
}

}  // namespace minfer
