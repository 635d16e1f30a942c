// Each row's k best values on the device: a sampled batch step reads k candidates a row instead of the whole
// vocabulary (64 rows of 152k logits are 39 MB; their top-40s are 20 KB).
//
// Two passes, as the argmax: blocks of kSegment values each keep their own k best, then one block a row keeps
// the k best of those.  A block selects in shared memory by radix select on order-preserving 32-bit keys (four
// 8-bit digits, most significant first: the k-th largest key T and how many keys equal to T are among the k
// best), gathers the keys above T and the first of those equal to T by position, and sorts its k by rank.
// Positions order equal keys by id in both passes (a first-pass block's output is sorted, blocks in id order),
// so ties go to the lower id, as the sampler's top_k breaks them.  Reference: tests/test_cuda_top_k.py.
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace minfer::cuda {

namespace {

constexpr int kSegment = 4096;  // values a first-pass block selects from (16 KB of keys)
constexpr int kThreads = 512;
constexpr size_t kMaxSecondPass = 160 * 1024;  // the second pass's keys in shared memory, at most

// Larger float, larger key; -0 and +0 one key (they compare equal); NaN below every value (it is flagged).
__device__ __forceinline__ uint32_t order_key(float v) {
    if (v != v) return 0u;
    const uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// The m-th largest of keys[0, len) (1 <= m <= len), T, and how many keys equal to T are among the m largest.
__device__ void radix_select(const uint32_t* keys, int len, int m, uint32_t* hist, uint32_t* pick, uint32_t& T,
                             int& need) {
    uint32_t prefix = 0, mask = 0;
    need = m;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < len; i += blockDim.x) {
            const uint32_t k = keys[i];
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {  // lane l sums digits 255 - 8l down to 248 - 8l; the first lane to reach need
            const int lane = threadIdx.x;
            uint32_t own = 0;
            for (int j = 0; j < 8; j++) own += hist[255 - 8 * lane - j];
            uint32_t incl = own;
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const int first = __ffs(__ballot_sync(0xffffffffu, incl >= uint32_t(need))) - 1;
            if (lane == first) {
                uint32_t above = incl - own;
                for (int j = 0; j < 8; j++) {
                    const uint32_t d = uint32_t(255 - 8 * lane - j);
                    if (above + hist[d] >= uint32_t(need)) {
                        pick[0] = d;
                        pick[1] = uint32_t(need) - above;
                        break;
                    }
                    above += hist[d];
                }
            }
        }
        __syncthreads();
        prefix |= pick[0] << shift;
        mask |= 255u << shift;
        need = int(pick[1]);
        __syncthreads();  // pick and hist are rewritten by the next digit
    }
    T = prefix;
}

// Block (b, r) selects from row r's values [b * seg, b * seg + seg).  kFirst: `in` holds the logits (ids are
// positions); else keys, with their ids at in_ids.  Out: k a block, as floats (the last pass) or keys; a short
// segment's missing places are key 0 (below every value) with id INT_MAX.
template <bool kFirst>
__global__ void __launch_bounds__(kThreads) top_k_kernel(const void* __restrict__ in, const int32_t* __restrict__ in_ids,
                                                         int64_t ld, int n, int seg, int k, void* out_keys,
                                                         int32_t* out_ids, bool out_floats, uint32_t* err) {
    pdl_start();
    extern __shared__ uint32_t keys[];
    __shared__ uint32_t hist[256], pick[2], n_above;
    __shared__ uint32_t cand_key[kTopKMax];
    __shared__ int32_t cand_id[kTopKMax];
    __shared__ int warp_n[kThreads / 32];
    const int row = blockIdx.y, begin = blockIdx.x * seg, len = min(seg, n - begin);
    const int64_t base = int64_t(row) * ld + begin;
    bool nan = false;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        if constexpr (kFirst) {
            const float v = ((const float*)in)[base + i];
            nan |= v != v;
            keys[i] = order_key(v);
        } else {
            keys[i] = ((const uint32_t*)in)[base + i];
        }
    }
    if (__syncthreads_or(nan) && threadIdx.x == 0) atomicOr(err, kNanLogit);
    auto id_of = [&](int i) { return kFirst ? begin + i : in_ids[base + i]; };
    const int m = min(k, len);
    uint32_t T;
    int need;
    radix_select(keys, len, m, hist, pick, T, need);
    if (threadIdx.x == 0) n_above = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < len; i += blockDim.x)
        if (keys[i] > T) {
            const uint32_t s = atomicAdd(&n_above, 1u);
            cand_key[s] = keys[i];
            cand_id[s] = id_of(i);
        }
    // the keys equal to T: the first `need` by position, a block-wide tile at a time in order
    const int above = m - need, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int tile = 0, taken = 0; tile < len && taken < need; tile += blockDim.x) {
        const int i = tile + threadIdx.x;
        const bool eq = i < len && keys[i] == T;
        const unsigned b = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_n[warp] = __popc(b);
        __syncthreads();
        int before = taken + __popc(b & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < nwarps; w++) {
            before += w < warp ? warp_n[w] : 0;
            total += warp_n[w];
        }
        if (eq && before < need) {
            cand_key[above + before] = T;
            cand_id[above + before] = id_of(i);
        }
        taken += total;
        __syncthreads();
    }
    __syncthreads();
    const int64_t out = (int64_t(row) * gridDim.x + blockIdx.x) * k;
    for (int t = threadIdx.x; t < m; t += blockDim.x) {  // each candidate to its rank: key descending, then id
        const uint32_t kt = cand_key[t];
        const int32_t it = cand_id[t];
        int rank = 0;
        for (int j = 0; j < m; j++) rank += cand_key[j] > kt || (cand_key[j] == kt && cand_id[j] < it);
        if (out_floats) ((float*)out_keys)[out + rank] = key_value(kt);
        else ((uint32_t*)out_keys)[out + rank] = kt;
        out_ids[out + rank] = it;
    }
    for (int t = m + threadIdx.x; t < k; t += blockDim.x) {  // (never in the last pass: there k < n)
        if (!out_floats) ((uint32_t*)out_keys)[out + t] = 0u;
        out_ids[out + t] = INT_MAX;
    }
}

int segments(int n) { return (n + kSegment - 1) / kSegment; }

}  // namespace

size_t top_k_scratch_bytes(int n, int rows, int k) {
    const int P = segments(n);
    return P > 1 ? size_t(rows) * size_t(P) * size_t(k) * 8 : 0;
}

void top_k_rows(const float* x, int64_t ld, int n, int rows, int k, float* vals, int32_t* ids, void* scratch,
                uint32_t* err, cudaStream_t s) {
    if (k < 1 || k > kTopKMax || k >= n)
        throw MinferError(strfmt("CUDA top-k: k = %d for rows of %d values (0 < k < n, k <= %d)", k, n, kTopKMax));
    if (rows < 1) return;
    const int P = segments(n);
    if (P == 1) {
        launch("top_k", top_k_kernel<true>, dim3(1u, unsigned(rows)), dim3(kThreads), size_t(n) * 4, s, (const void*)x,
               (const int32_t*)nullptr, ld, n, n, k, (void*)vals, ids, true, err);
        return;
    }
    const int len2 = P * k;
    if (size_t(len2) * 4 > kMaxSecondPass)
        throw MinferError(strfmt("CUDA top-k: %d rows of %d values at k = %d exceed its second pass (%zu KB)", rows, n,
                                 k, kMaxSecondPass / 1024));
    static bool raised = false;  // the opt-in above 48 KB of shared memory, once per process
    if (!raised) {
        const cudaError_t e = cudaFuncSetAttribute(top_k_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   int(kMaxSecondPass));
        if (e != cudaSuccess) throw MinferError(strfmt("CUDA top-k: %s", cudaGetErrorString(e)));
        raised = true;
    }
    uint32_t* part_keys = (uint32_t*)scratch;
    int32_t* part_ids = (int32_t*)(part_keys + size_t(rows) * size_t(len2));
    launch("top_k", top_k_kernel<true>, dim3(unsigned(P), unsigned(rows)), dim3(kThreads), size_t(kSegment) * 4, s,
           (const void*)x, (const int32_t*)nullptr, ld, n, kSegment, k, (void*)part_keys, part_ids, false, err);
    launch("top_k_final", top_k_kernel<false>, dim3(1u, unsigned(rows)), dim3(kThreads), size_t(len2) * 4, s,
           (const void*)part_keys, (const int32_t*)part_ids, int64_t(len2), len2, len2, k, (void*)vals, ids, true, err);
}

}  // namespace minfer::cuda
