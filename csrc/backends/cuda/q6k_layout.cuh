// How Q6_K weights lie in device memory.  A GGUF Q6_K block is 210 bytes -- ql[128] (low 4 bits), qh[64]
// (high 2 bits), scales[16] (int8), d (f16) -- packed, so in a row block b starts 2b mod 16 bytes off the
// 16-byte grid.  The upload (q6k_lay_rows) keeps the block's size and its ql, and re-lays the rest for the
// decode matvec's chunks (matvec_q8_chunks.cuh: chunk c4 = 0..3 of a block is sub-blocks j and j + 2, j = 4
// (c4 / 2) + c4 % 2, the low and the high nibbles of ql's 32 bytes at 32 c4):
//   - qh is re-laid as one 16-byte piece a chunk (qh' + 16 c4): byte l holds the high bits of ql bytes l and
//     l + 16 of the chunk, as (lo_l | lo_l+16 << 2 | hi_l << 4 | hi_l+16 << 6) -- GGUF's qh byte with the
//     chunk's two halves in place of its two kk -- so a chunk reads 16 bytes of qh, not 32 shared with its
//     neighbour;
//   - a chunk's four scales (sub-block j's two, then j + 2's) are one aligned 32-bit word;
//   - each row is padded to 16 bytes and block b rotated right by q6k_pre(b) = -2b mod 16 bytes: the first pre
//     bytes of its 18-byte tail S move to its front, so ql starts at pre and qh' at pre + 128, both 16-byte
//     aligned.  S is [scales, d] where pre % 4 == 0, [d, scales] otherwise, so that every chunk's scale word
//     is 4-byte aligned and lies wholly on one side of the split.
// Byte s of S lies at q6k_s(s, pre): s before pre, else 192 + s.  Rows grow by at most 14 bytes.
#pragma once
#include <cstdint>
#include <cstring>

namespace minfer::cuda {

__host__ __device__ inline int q6k_pre(int64_t block) { return int((16 - 2 * (block & 7)) & 15); }
__host__ __device__ inline int q6k_s(int s, int pre) { return s < pre ? s : 192 + s; }
// Offsets in a device block: chunk c4's four scales, and d.
__host__ __device__ inline int q6k_sc(int c4, int pre) { return q6k_s((pre & 2) + 4 * c4, pre); }
__host__ __device__ inline int q6k_d(int pre) { return q6k_s(pre & 2 ? 0 : 16, pre); }
__host__ __device__ inline int64_t q6k_row_bytes(int64_t K) { return (K / 256 * 210 + 15) / 16 * 16; }

// One GGUF block o -> its chunk order t (unrotated: ql, qh', S).
inline void q6k_chunk_order(const uint8_t* o, uint8_t* t, int pre) {
    static const int kScaleOrder[16] = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};
    std::memcpy(t, o, 128);
    for (int c4 = 0; c4 < 4; c4++) {
        const int half = c4 / 2, kk = c4 % 2;
        for (int l = 0; l < 16; l++) {
            const int a = o[128 + 32 * half + l] >> (2 * kk), b = o[128 + 32 * half + 16 + l] >> (2 * kk);
            t[128 + 16 * c4 + l] = uint8_t((a & 3) | (b & 3) << 2 | ((a >> 4) & 3) << 4 | ((b >> 4) & 3) << 6);
        }
    }
    const int sc = pre & 2 ? 2 : 0, d = pre & 2 ? 0 : 16;
    for (int i = 0; i < 16; i++) t[192 + sc + i] = o[192 + kScaleOrder[i]];
    t[192 + d] = o[208];
    t[192 + d + 1] = o[209];
}

// rows GGUF Q6_K rows of K values (src, packed) -> the device layout (dst, q6k_row_bytes(K) a row).
inline void q6k_lay_rows(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t K) {
    const int64_t nb = K / 256, rb = nb * 210, rbd = q6k_row_bytes(K);
    uint8_t t[210];
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t* s = src + r * rb;
        uint8_t* d = dst + r * rbd;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t* n = d + b * 210;
            const int pre = q6k_pre(b);
            q6k_chunk_order(s + b * 210, t, pre);
            std::memcpy(n, t + 192, size_t(pre));
            std::memcpy(n + pre, t, 192);
            std::memcpy(n + pre + 192, t + 192 + pre, size_t(18 - pre));
        }
        std::memset(d + rb, 0, size_t(rbd - rb));
    }
}

}  // namespace minfer::cuda
