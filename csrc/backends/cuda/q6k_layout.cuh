// How Q6_K weights lie in device memory.  A GGUF Q6_K block is 210 bytes -- ql[128] (low 4 bits), qh[64]
// (high 2 bits), scales[16] (int8), d (f16) -- packed, so in a row block b starts 2b mod 16 bytes off the
// 16-byte grid and its quant bytes can only be read as funnel-shifted words.  The upload (q6k_lay_rows) pads
// each row to a multiple of 16 bytes and rotates block b right by q6k_pre(b) = -2b mod 16 bytes: the first
// pre bytes of its 18-byte tail S (scales, then d) move to its front, so that ql starts at pre and qh at
// pre + 128, both 16-byte aligned in a 16-byte-aligned row.  Byte s of S lies at q6k_s(s, pre): s before
// pre, else 192 + s (d, s = 16, always at 208).  Same bytes, same block size; rows grow by at most 14 bytes.
#pragma once
#include <cstdint>
#include <cstring>

namespace minfer::cuda {

__host__ __device__ inline int q6k_pre(int64_t block) { return int((16 - 2 * (block & 7)) & 15); }
__host__ __device__ inline int q6k_s(int s, int pre) { return s < pre ? s : 192 + s; }
__host__ __device__ inline int64_t q6k_row_bytes(int64_t K) { return (K / 256 * 210 + 15) / 16 * 16; }

// rows GGUF Q6_K rows of K values (src, packed) -> the device layout (dst, q6k_row_bytes(K) a row).
inline void q6k_lay_rows(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t K) {
    const int64_t nb = K / 256, rb = nb * 210, rbd = q6k_row_bytes(K);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t* s = src + r * rb;
        uint8_t* d = dst + r * rbd;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* o = s + b * 210;
            uint8_t* n = d + b * 210;
            const int pre = q6k_pre(b);
            std::memcpy(n, o + 192, size_t(pre));
            std::memcpy(n + pre, o, 192);
            std::memcpy(n + pre + 192, o + 192 + pre, size_t(18 - pre));
        }
        std::memset(d + rb, 0, size_t(rbd - rb));
    }
}

}  // namespace minfer::cuda
