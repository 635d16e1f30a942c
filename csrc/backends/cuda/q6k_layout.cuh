// How Q6_K weights lie in device memory.  A GGUF Q6_K block is 210 bytes -- ql[128] (low 4 bits), qh[64]
// (high 2 bits), scales[16] (int8), d (f16) -- packed, so in a row block b starts 2b mod 16 bytes off the
// 16-byte grid.  The upload (q6k_lay_rows) keeps the block's size and re-lays it for the decode matvec's chunks
// (matvec_q8_chunks.cuh: chunk g = 0..3 of a block is its sub-blocks 2g and 2g + 1, values 64g .. 64g + 63):
//   - ql is re-paired: byte 32g + l holds value l of sub-block 2g in its low nibble and value l of 2g + 1 in its
//     high one (GGUF pairs sub-blocks k and k + 2 of each half), so a chunk's x is 64 contiguous bytes and its
//     two x scales one aligned float4;
//   - qh is re-laid as one 16-byte piece a chunk (qh' + 16g): byte l holds the high bits of the chunk's values
//     l, l + 16, 32 + l and 48 + l in its bits 0-1, 2-3, 4-5 and 6-7, so a chunk reads 16 bytes of qh, not 32
//     shared with its neighbour;
//   - the scales stay in GGUF's order, which makes a chunk's four (sub-block 2g's two, then 2g + 1's) one aligned
//     32-bit word;
//   - each row is padded to 16 bytes and block b rotated right by q6k_pre(b) = -2b mod 16 bytes: the first pre
//     bytes of its 18-byte tail S move to its front, so ql starts at pre and qh' at pre + 128, both 16-byte
//     aligned.  S is [scales, d] where pre % 4 == 0, [d, scales] otherwise, so that every chunk's scale word
//     is 4-byte aligned and lies wholly on one side of the split.
// Byte s of S lies at q6k_s(s, pre): s before pre, else 192 + s.  Rows grow by at most 14 bytes.
// Reference: ggml's Q6_K layout (csrc/quant/dequantize.cpp); tests/test_cuda_matvec.py reads it back.
#pragma once
#include <cstdint>
#include <cstring>

namespace minfer::cuda {

__host__ __device__ inline int q6k_pre(int64_t block) { return int((16 - 2 * (block & 7)) & 15); }
__host__ __device__ inline int q6k_s(int s, int pre) { return s < pre ? s : 192 + s; }
// Offsets in a device block: chunk g's four scales, and d.
__host__ __device__ inline int q6k_sc(int g, int pre) { return q6k_s((pre & 2) + 4 * g, pre); }
__host__ __device__ inline int q6k_d(int pre) { return q6k_s(pre & 2 ? 0 : 16, pre); }
__host__ __device__ inline int64_t q6k_row_bytes(int64_t K) { return (K / 256 * 210 + 15) / 16 * 16; }

// One GGUF block o -> its chunk order t (unrotated: ql', qh', S).  In GGUF, half hf of a block (values 128 hf..)
// holds its sub-blocks k = 0..3 as: k = 0, 1 the low nibbles of ql bytes 64 hf + l and 64 hf + 32 + l, k = 2, 3
// their high nibbles; k's high bits in bits 2k of qh byte 32 hf + l (l = 0..31; ggml's dequantize_row_q6_K).
// So chunk g = 2 hf + kk (sub-blocks k = 2 kk and 2 kk + 1 of half hf) takes nibble kk of each of those two
// ql bytes, and bits 4 kk .. 4 kk + 3 of the qh bytes.
inline void q6k_chunk_order(const uint8_t* o, uint8_t* t, int pre) {
    for (int hf = 0; hf < 2; hf++) {
        const uint8_t *ql = o + 64 * hf, *qh = o + 128 + 32 * hf;
        for (int l = 0; l < 32; l++) {
            t[64 * hf + l] = uint8_t((ql[l] & 15) | (ql[32 + l] & 15) << 4);
            t[64 * hf + 32 + l] = uint8_t((ql[l] >> 4) | (ql[32 + l] & 0xf0));
        }
        for (int kk = 0; kk < 2; kk++)
            for (int l = 0; l < 16; l++) {
                const int a = qh[l] >> (4 * kk), b = qh[16 + l] >> (4 * kk);  // values l and 16 + l of both
                t[128 + 16 * (2 * hf + kk) + l] =
                    uint8_t((a & 3) | (b & 3) << 2 | ((a >> 2) & 3) << 4 | ((b >> 2) & 3) << 6);
            }
    }
    const int sc = pre & 2 ? 2 : 0, d = pre & 2 ? 0 : 16;
    std::memcpy(t + 192 + sc, o + 192, 16);
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
