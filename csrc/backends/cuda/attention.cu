// Causal GQA attention over the KV cache, flash-style: each block owns one
// (query head, row) and walks the row's visible positions in chunks of 256
// with an online softmax (running max, running sum, rescaled output).
//
// Decode (one row) splits the KV length over gridDim.z blocks whose partials
// a combine kernel merges (flash decoding); the split count depends only on
// n_ctx, so a captured decode graph stays valid as the cache fills: blocks
// whose chunks lie past the row's position write an empty partial.  Prefill
// rows use one block each (there are rows x heads blocks already).
//
// Positions are read on the device, never from the host: the same launch
// serves every step.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "quant/types.h"

namespace minfer::cuda {

namespace {

constexpr int kChunk = 256, kThreads = 128, kMaxHeadDim = 256;

__device__ __forceinline__ float kv_at(uint32_t kv_type, const uint8_t* base, int64_t j, int dim, int col) {
    if (kv_type == GGML_TYPE_F16) return __half2float(((const __half*)base)[j * dim + col]);
    if (kv_type == GGML_TYPE_F32) return ((const float*)base)[j * dim + col];
    const uint8_t* blk = base + j * int64_t(dim / 32) * 34 + (col / 32) * 34;  // q8_0
    return f16_at(blk) * float(((const int8_t*)blk)[2 + col % 32]);
}

__global__ void __launch_bounds__(kThreads) attention_kernel(AttnShape a, const float* __restrict__ q, int64_t ldq,
                                                             const int32_t* __restrict__ pos,
                                                             const uint8_t* __restrict__ K,
                                                             const uint8_t* __restrict__ V, float* __restrict__ out,
                                                             int64_t ldo, float* __restrict__ partial,
                                                             uint32_t* err) {
    __shared__ float qs[kMaxHeadDim];
    __shared__ float s[kChunk];
    __shared__ float scratch[32];
    const int h = blockIdx.x, r = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int hd = a.head_dim, dim = a.n_head_kv * hd, col0 = (h / (a.n_head / a.n_head_kv)) * hd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int p = pos[r];
    float* o_final = out + int64_t(r) * ldo + int64_t(h) * hd;
    float* part = partial + ((int64_t(r) * a.n_head + h) * S + z) * (hd + 2);
    if (p < 0 || p >= a.n_ctx) {  // uniform over the block: no barrier is skipped by some threads only
        if (threadIdx.x == 0) atomicOr(err, kBadPosition);
        for (int d = threadIdx.x; d < hd; d += kThreads) {
            if (S == 1) o_final[d] = 0.0f;
            else part[2 + d] = 0.0f;
        }
        if (S > 1 && threadIdx.x == 0) { part[0] = -INFINITY; part[1] = 0.0f; }
        return;
    }
    for (int d = threadIdx.x; d < hd; d += kThreads) qs[d] = q[int64_t(r) * ldq + int64_t(h) * hd + d];
    __syncthreads();

    float m = -INFINITY, l = 0.0f, o[kMaxHeadDim / kThreads] = {0.0f, 0.0f};
    for (int c = z; c * kChunk <= p; c += S) {
        const int j0 = c * kChunk, n = min(kChunk, p + 1 - j0);
        for (int jj = warp; jj < n; jj += kThreads / 32) {
            float dot = 0.0f;
            for (int d = lane; d < hd; d += 32) dot += qs[d] * kv_at(a.kv_type, K, j0 + jj, dim, col0 + d);
            dot = warp_sum(dot);
            if (lane == 0) s[jj] = dot * a.scale;
        }
        __syncthreads();
        float cm = -INFINITY;
        for (int jj = threadIdx.x; jj < n; jj += kThreads) cm = fmaxf(cm, s[jj]);
        cm = block_max(cm, scratch);
        const float nm = fmaxf(m, cm), corr = expf(m - nm);  // exp(-inf) = 0 on the first chunk
        float cs = 0.0f;
        for (int jj = threadIdx.x; jj < n; jj += kThreads) {
            const float e = expf(s[jj] - nm);
            s[jj] = e;
            cs += e;
        }
        cs = block_sum(cs, scratch);  // its barriers also publish s[] to every thread
        l = l * corr + cs;
        m = nm;
#pragma unroll
        for (int t = 0; t < kMaxHeadDim / kThreads; t++) {
            const int d = threadIdx.x + t * kThreads;
            if (d < hd) {
                float acc = o[t] * corr;
                for (int jj = 0; jj < n; jj++) acc += s[jj] * kv_at(a.kv_type, V, j0 + jj, dim, col0 + d);
                o[t] = acc;
            }
        }
        __syncthreads();  // s[] is rewritten by the next chunk
    }
#pragma unroll
    for (int t = 0; t < kMaxHeadDim / kThreads; t++) {
        const int d = threadIdx.x + t * kThreads;
        if (d < hd) {
            if (S == 1) o_final[d] = o[t] / l;
            else part[2 + d] = o[t];
        }
    }
    if (S > 1 && threadIdx.x == 0) {
        part[0] = m;
        part[1] = l;
    }
}

// Merges the S partials of each (row, head): weights exp(m_z - max m).
__global__ void attention_combine_kernel(AttnShape a, int S, const float* __restrict__ partial, float* __restrict__ out,
                                         int64_t ldo) {
    const int h = blockIdx.x, r = blockIdx.y, hd = a.head_dim;
    const float* base = partial + (int64_t(r) * a.n_head + h) * S * (hd + 2);
    float M = -INFINITY;
    for (int z = 0; z < S; z++) M = fmaxf(M, base[z * (hd + 2)]);
    float L = 0.0f;
    for (int z = 0; z < S; z++) {
        const float mz = base[z * (hd + 2)];
        if (mz > -INFINITY) L += expf(mz - M) * base[z * (hd + 2) + 1];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < S; z++) {
            const float mz = base[z * (hd + 2)];
            if (mz > -INFINITY) acc += expf(mz - M) * base[z * (hd + 2) + 2 + d];
        }
        out[int64_t(r) * ldo + int64_t(h) * hd + d] = L > 0.0f ? acc / L : 0.0f;
    }
}

}  // namespace

int attention_splits(const AttnShape& a) {
    return a.rows == 1 ? (a.n_ctx + kChunk - 1) / kChunk : 1;
}

size_t attention_scratch_floats(const AttnShape& a) {
    const int S = attention_splits(a);
    return S > 1 ? size_t(a.rows) * size_t(a.n_head) * size_t(S) * size_t(a.head_dim + 2) : 0;
}

void attention(const AttnShape& a, const float* q, int64_t ldq, const int32_t* pos, const void* K, const void* V,
               float* out, int64_t ldo, float* scratch, uint32_t* err, cudaStream_t s) {
    if (a.head_dim > kMaxHeadDim || a.n_head_kv <= 0 || a.n_head % a.n_head_kv)
        throw MinferError(strfmt("CUDA attention: head_dim %d (at most %d), %d heads over %d KV heads", a.head_dim,
                                 kMaxHeadDim, a.n_head, a.n_head_kv));
    const int S = attention_splits(a);
    attention_kernel<<<dim3(unsigned(a.n_head), unsigned(a.rows), unsigned(S)), kThreads, 0, s>>>(
        a, q, ldq, pos, (const uint8_t*)K, (const uint8_t*)V, out, ldo, scratch, err);
    check_launch("attention");
    if (S > 1) {
        attention_combine_kernel<<<dim3(unsigned(a.n_head), unsigned(a.rows)), 128, 0, s>>>(a, S, scratch, out, ldo);
        check_launch("attention_combine");
    }
}

}  // namespace minfer::cuda
