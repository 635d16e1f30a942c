// The rotary embedding's arithmetic, shared by the RoPE kernels (norm_rope.cu) and the
// decode QKV matvec that rotates in its epilogue (matvec_q8.cu): one definition, so the
// fused and the separate paths give the same bits.  Reference: tests/test_cuda.py (test_rope,
// test_qkv_rope_matches_unfused).
#pragma once
#include <cuda_runtime.h>

namespace minfer::cuda {

// The angle of rotated pair i at position p, in double: positions in the thousands times
// frequencies near 1 leave an f32 angle few correct bits (at 30000, ~1e-3 rad off).
// scale: linear RoPE scaling (1: none).
__device__ __forceinline__ void rope_angle(int p, int i, int rope_dim, float base, float scale, double* cs, double* sn) {
    sincos(double(p) * double(scale) * pow(double(base), -2.0 * i / rope_dim), sn, cs);
}

// The pair (x0, x1) rotated by (cs, sn): the products in double, one rounding to f32.  The
// explicit roundings keep the compiler from contracting differently in different kernels.
__device__ __forceinline__ float rope_lo(double x0, double x1, double cs, double sn) {
    return float(__dadd_rn(__dmul_rn(x0, cs), -__dmul_rn(x1, sn)));
}
__device__ __forceinline__ float rope_hi(double x0, double x1, double cs, double sn) {
    return float(__dadd_rn(__dmul_rn(x0, sn), __dmul_rn(x1, cs)));
}

}  // namespace minfer::cuda
