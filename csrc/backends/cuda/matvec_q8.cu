// Decode's matrix-vector products for quantized weights, on 8-bit activations:
// the llama.cpp recipe (its "mmvq"), written for this backend.
//
// Each block stages a K tile of every activation row in shared memory already
// quantized to blocks of 32 int8 values with a scale d and s = d * sum(q) --
// the CPU's Q8_0 quants exactly (amax / 127, round half away from zero; the
// scale kept in f32 where the CPU stores f16) -- so x costs ~1.1 bytes a value to stage and read instead of 4.  A warp owns a
// weight row; each lane takes 32-weight units, unpacks their quants into
// bytes and multiplies four at a time with __dp4a against the staged int8 x:
//
//   sum_i w_i x_i = a * d_x * sum_i(q_i qx_i) - b * s_x      (w = a q - b)
//
// (per 16-value half for Q6_K's two scales).  8 integer instructions per 32
// weights replace 32 int->float conversions and 32 FMAs, which were what the
// float kernel (matvec.cu) spent its time on.
#include <algorithm>

#include "backends/cuda/dequant.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/unit_decode.cuh"

namespace minfer::cuda {

namespace {

constexpr int kWarps = 8, kR = kMatvecMaxRows;
constexpr int kTileValues = 16384;  // staged int8 x per block, all rows: 24 KB + scales
constexpr int kUnitBytes = 48;      // 32 int8 values, padded so 8 lanes' 16-byte reads hit distinct banks

struct XUnit {  // one staged 32-value unit of one activation row
    int q[8];
    float d, s;
};

__device__ __forceinline__ int dot8(const int* v, const int* x, int c = 0) {
#pragma unroll
    for (int k = 0; k < 8; k++) c = __dp4a(v[k], x[k], c);
    return c;
}
__device__ __forceinline__ int dot4(const int* v, const int* x) {
    int c = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) c = __dp4a(v[k], x[k], c);
    return c;
}
// 4 bits (of qh) to bit 4 of each of 4 bytes.
__device__ __forceinline__ int spread4(uint32_t h) {
    return int(((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25));
}
__device__ __forceinline__ void load32_a2(const uint8_t* p, uint32_t* w) {
    load16_a2(p, w);
    load16_a2(p + 16, w + 4);
}

// This unit's dot with one staged x unit: sum_i w_i x_i.
template <int T>
__device__ __forceinline__ float unit_dot_q8(const uint8_t* __restrict__ row, int64_t u, const XUnit& x) {
    if constexpr (T == GGML_TYPE_Q8_0) {
        const uint8_t* b = row + u * 34;
        uint32_t qs[8];
        load32_a2(b + 2, qs);
        return h2f(*(const uint16_t*)b) * x.d * float(dot8((const int*)qs, x.q));
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1) {
        const uint8_t* b = row + u * Block<T>::bytes;
        uint32_t qs[4];
        uint32_t qh = 0;
        float a, off;
        if constexpr (T == GGML_TYPE_Q4_0) {
            load16_a2(b + 2, qs);
            a = h2f(*(const uint16_t*)b), off = 8.0f * a;
        } else if constexpr (T == GGML_TYPE_Q4_1) {
            load16_a4(b + 4, qs);
            const uint32_t dm = *(const uint32_t*)b;
            a = h2f(dm), off = -h2f(dm >> 16);
        } else if constexpr (T == GGML_TYPE_Q5_0) {
            qh = u32_at2(b + 2);
            load16_a2(b + 6, qs);
            a = h2f(*(const uint16_t*)b), off = 16.0f * a;
        } else {
            const uint32_t dm = *(const uint32_t*)b;
            qh = *(const uint32_t*)(b + 4);
            load16_a4(b + 8, qs);
            a = h2f(dm), off = -h2f(dm >> 16);
        }
        int v[8];  // values 4k..4k+3: low nibbles (k < 4), high nibbles (k >= 4)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = int(qs[k] & 0x0F0F0F0Fu);
            v[k + 4] = int((qs[k] >> 4) & 0x0F0F0F0Fu);
            if constexpr (T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1) {
                v[k] |= spread4((qh >> (4 * k)) & 0xf);
                v[k + 4] |= spread4((qh >> (16 + 4 * k)) & 0xf);
            }
        }
        return a * x.d * float(dot8(v, x.q)) - off * x.s;
    } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        const uint8_t* b = row + (u / 8) * Block<T>::bytes;
        const int j = int(u % 8);
        const uint32_t dm = *(const uint32_t*)b;
        const uint32_t s0 = ((const uint32_t*)b)[1], s1 = ((const uint32_t*)b)[2], s2 = ((const uint32_t*)b)[3];
        int sc, m;
        if (j < 4) {
            sc = scale_byte(s0, s1, s2, j) & 63;
            m = scale_byte(s0, s1, s2, j + 4) & 63;
        } else {
            sc = (scale_byte(s0, s1, s2, j + 4) & 0xf) | ((scale_byte(s0, s1, s2, j - 4) >> 6) << 4);
            m = (scale_byte(s0, s1, s2, j + 4) >> 4) | ((scale_byte(s0, s1, s2, j) >> 6) << 4);
        }
        uint32_t qs[8];
        const uint8_t* qp = b + (T == GGML_TYPE_Q4_K ? 16 : 48) + 32 * (j / 2);
        load16_a16(qp, qs);
        load16_a16(qp + 16, qs + 4);
        const int shift = 4 * (j % 2);
        int v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = int((qs[k] >> shift) & 0x0F0F0F0Fu);
        if constexpr (T == GGML_TYPE_Q5_K) {
            uint32_t qh[8];
            load16_a16(b + 16, qh);
            load16_a16(b + 32, qh + 4);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] |= int(((qh[k] >> j) & 0x01010101u) << 4);
        }
        return h2f(dm) * float(sc) * x.d * float(dot8(v, x.q)) - h2f(dm >> 16) * float(m) * x.s;
    } else if constexpr (T == GGML_TYPE_Q6_K) {
        const uint8_t* b = row + (u / 8) * 210;
        const int j = int(u % 8), half = j / 4, k = j % 4;
        uint32_t ql[8], qh[8];
        load32_a2(b + half * 64 + (k % 2) * 32, ql);
        load32_a2(b + 128 + half * 32, qh);
        int v[8];
#pragma unroll
        for (int w = 0; w < 8; w++)
            v[w] = int(((ql[w] >> (4 * (k / 2))) & 0x0F0F0F0Fu) | (((qh[w] >> (2 * k)) & 0x03030303u) << 4));
        const int ones[4] = {0x01010101, 0x01010101, 0x01010101, 0x01010101};
        const int lo = dot4(v, x.q) - 32 * dot4(ones, x.q), hi = dot4(v + 4, x.q + 4) - 32 * dot4(ones, x.q + 4);
        const uint32_t sc = *(const uint16_t*)(b + 192 + 2 * j);
        const float d = h2f(*(const uint16_t*)(b + 208)) * x.d;
        return d * (float(int8_t(sc & 0xff)) * float(lo) + float(int8_t(sc >> 8)) * float(hi));
    } else {
        return 0.0f;  // float weights take matvec.cu
    }
}

template <int T>
__device__ __forceinline__ void unit_dots_q8(const uint8_t* __restrict__ w, int64_t u_first, int units,
                                             const uint8_t* xq, const float2* xds, int row_units, int n_rows,
                                             float (&acc)[kR]) {
    for (int u = threadIdx.x & 31; u < units; u += 32) {
#pragma unroll
        for (int r = 0; r < kR; r++) {
            if (r < n_rows) {
                XUnit x;
                const int4* p = (const int4*)(xq + (r * row_units + u) * kUnitBytes);
                const int4 a = p[0], b = p[1];
                x.q[0] = a.x, x.q[1] = a.y, x.q[2] = a.z, x.q[3] = a.w, x.q[4] = b.x, x.q[5] = b.y, x.q[6] = b.z,
                x.q[7] = b.w;
                const float2 ds = xds[r * row_units + u];
                x.d = ds.x, x.s = ds.y;
                acc[r] += unit_dot_q8<T>(w, u_first + u, x);
            }
        }
    }
}

__device__ __forceinline__ void unit_dots_q8_any(uint32_t type, const uint8_t* w, int64_t u_first, int units,
                                                 const uint8_t* xq, const float2* xds, int row_units, int n_rows,
                                                 float (&acc)[kR]) {
    switch (type) {
#define X(t) case t: unit_dots_q8<t>(w, u_first, units, xq, xds, row_units, n_rows, acc); break;
        X(GGML_TYPE_Q4_0) X(GGML_TYPE_Q4_1) X(GGML_TYPE_Q5_0) X(GGML_TYPE_Q5_1) X(GGML_TYPE_Q8_0)
        X(GGML_TYPE_Q4_K) X(GGML_TYPE_Q5_K) X(GGML_TYPE_Q6_K)
#undef X
        default: break;
    }
}

__global__ void __launch_bounds__(32 * kWarps, 3) matvec_q8_kernel(MatvecArgs a, int tile) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int row_units = tile / 32;
    uint8_t* xq = sm;
    float2* xds = (float2*)(sm + size_t(a.n_rows) * row_units * kUnitBytes);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t o = int64_t(blockIdx.x) * kWarps + warp;
    int p = 0;
    if (!a.swiglu)
        while (p < a.n_parts && o >= a.part[p].n_out) o -= a.part[p++].n_out;
    const bool live = a.swiglu ? o < a.part[0].n_out : p < a.n_parts;
    const MatvecPart& A = a.part[live ? p : 0];
    float acc[kR], acc2[kR];
#pragma unroll
    for (int r = 0; r < kR; r++) acc[r] = acc2[r] = 0.0f;
    for (int64_t k0 = 0; k0 < a.K; k0 += tile) {
        const int units = int(min(int64_t(tile), a.K - k0)) / 32;
        __syncthreads();  // the previous tile is no longer read
        // Quantize the tile: a warp per 32-value unit, a lane per value.
        for (int e = warp; e < a.n_rows * units; e += kWarps) {
            const int r = e / units, u = e % units;
            const float v = a.x[r * a.ldx + k0 + u * 32 + lane];
            const float amax = warp_max(fabsf(v));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const int q = int(roundf(v * id));
            xq[(r * row_units + u) * kUnitBytes + lane] = uint8_t(int8_t(q));
            const float sum = warp_sum(float(q));  // |sum| <= 32 * 127: exact in f32
            if (lane == 0) xds[r * row_units + u] = make_float2(d, d * sum);
        }
        __syncthreads();
        if (live) {
            unit_dots_q8_any(A.type, A.W + o * A.rb, k0 / 32, units, xq, xds, row_units, a.n_rows, acc);
            if (a.swiglu)
                unit_dots_q8_any(a.part[1].type, a.part[1].W + o * a.part[1].rb, k0 / 32, units, xq, xds, row_units,
                                 a.n_rows, acc2);
        }
    }
    if (!live) return;  // after the last barrier
#pragma unroll
    for (int r = 0; r < kR; r++) {
        if (r < a.n_rows) {
            const float v = warp_sum(acc[r]);
            if (a.swiglu) {
                const float u = warp_sum(acc2[r]);
                if (lane == 0) a.y[r * a.ldy + o] = v / (1.0f + expf(-v)) * u;
            } else if (lane == 0) {
                a.y[r * a.ldy + A.y_col + o] = v + (A.bias ? A.bias[o] : 0.0f);
            }
        }
    }
}

}  // namespace

bool matvec_q8_takes(uint32_t type) {
    switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

void matvec_q8(const MatvecArgs& a, cudaStream_t s) {
    const int tile = int(std::min<int64_t>(a.K, kTileValues / a.n_rows / 32 * 32));
    int64_t rows = 0;
    if (a.swiglu) rows = a.part[0].n_out;
    else
        for (int p = 0; p < a.n_parts; p++) rows += a.part[p].n_out;
    const size_t smem = size_t(a.n_rows) * size_t(tile / 32) * (kUnitBytes + sizeof(float2));
    matvec_q8_kernel<<<unsigned((rows + kWarps - 1) / kWarps), 32 * kWarps, smem, s>>>(a, tile);
    check_launch("matvec_q8");
}

}  // namespace minfer::cuda
