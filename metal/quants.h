// What each GGUF block means, in MSL: dequant8<TYPE>(row, j, y) writes the 8
// weights j..j+7 (j a multiple of 8) of a row.  The element-by-element
// definitions of csrc/quant/dequantize.cpp (the reference), with the same
// float operations, so values are bit-identical to it.
#pragma once

enum : int { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
             T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };

// Bytes and values of one block (MSL is C++14: constexpr functions, no if constexpr).
template <int T> constexpr uint block_bytes() {
    return T == T_F32 ? 4 : T == T_F16 ? 2 : T == T_Q4_0 ? 18 : T == T_Q4_1 ? 20 : T == T_Q5_0 ? 22
         : T == T_Q5_1 ? 24 : T == T_Q8_0 ? 34 : T == T_Q4_K ? 144 : T == T_Q5_K ? 176 : 210;
}
template <int T> constexpr uint block_values() {
    return T == T_F32 || T == T_F16 ? 1 : T == T_Q4_K || T == T_Q5_K || T == T_Q6_K ? 256 : 32;
}

// f16 fields of packed blocks are 2-byte aligned
static inline float f16_at(device const uchar* p) { return float(*(device const half*)p); }

static inline void k_scale_min(device const uchar* s, uint j, thread int& sc, thread int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <int T>
static inline void dequant8(device const uchar* row, uint j, thread float* y) {
    if (T == T_F32) {
        for (int i = 0; i < 8; i++) y[i] = ((device const float*)row)[j + i];
        return;
    }
    if (T == T_F16) {
        for (int i = 0; i < 8; i++) y[i] = float(((device const half*)row)[j + i]);
        return;
    }
    device const uchar* b = row + (j / block_values<T>()) * block_bytes<T>();
    const uint e = j % block_values<T>();
    if (T == T_Q4_0 || T == T_Q4_1) {
        device const uchar* qs = b + (T == T_Q4_0 ? 2 : 4);
        const float d = f16_at(b);
        const uint shift = e >= 16 ? 4 : 0, l0 = e & 15;
        for (int i = 0; i < 8; i++) {
            const int q = (qs[l0 + i] >> shift) & 0xf;
            y[i] = T == T_Q4_0 ? d * float(q - 8) : d * float(q) + f16_at(b + 2);
        }
    } else if (T == T_Q5_0 || T == T_Q5_1) {
        const uint off = T == T_Q5_0 ? 2 : 4;
        const float d = f16_at(b);
        const uint qh = uint(b[off]) | uint(b[off + 1]) << 8 | uint(b[off + 2]) << 16 | uint(b[off + 3]) << 24;
        device const uchar* qs = b + off + 4;
        const uint shift = e >= 16 ? 4 : 0, l0 = e & 15;
        for (int i = 0; i < 8; i++) {
            const int q = int((qs[l0 + i] >> shift) & 0xf) | int((qh >> (e + i)) & 1) << 4;
            y[i] = T == T_Q5_0 ? d * float(q - 16) : d * float(q) + f16_at(b + 2);
        }
    } else if (T == T_Q8_0) {
        const float d = f16_at(b);
        for (int i = 0; i < 8; i++) y[i] = float(((device const char*)(b + 2))[e + i]) * d;
    } else if (T == T_Q4_K || T == T_Q5_K) {
        const float d = f16_at(b), dmin = f16_at(b + 2);
        const uint sub = e / 32, l0 = e % 32;
        int sc, m;
        k_scale_min(b + 4, sub, sc, m);
        const float dl = d * float(sc), ml = dmin * float(m);
        device const uchar* qs = b + (T == T_Q4_K ? 16 : 48) + 32 * (sub / 2);
        const uint shift = 4 * (sub % 2);
        for (int i = 0; i < 8; i++) {
            int v = (qs[l0 + i] >> shift) & 0xf;
            if (T == T_Q5_K) v |= ((b[16 + l0 + i] >> sub) & 1) << 4;
            y[i] = dl * float(v) - ml;
        }
    } else if (T == T_Q6_K) {
        const float d = f16_at(b + 208);
        const uint half_i = e / 128, k = (e / 32) % 4, m0 = e % 32;
        device const uchar* ql = b + half_i * 64 + (k % 2) * 32 + m0;
        device const uchar* qh = b + 128 + half_i * 32 + m0;
        const float dl = d * float(((device const char*)(b + 192))[e / 16]);
        for (int i = 0; i < 8; i++) {
            const int lo = (ql[i] >> (4 * (k / 2))) & 0xf, hi = (qh[i] >> (2 * k)) & 3;
            y[i] = dl * float((lo | hi << 4) - 32);
        }
    }
}
