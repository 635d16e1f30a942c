#include "backends/reference/reference_backend.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "backends/kv_format.h"
#include "common/error.h"
#include "common/half.h"
#include "quant/quant.h"

namespace minfer {

namespace {

double silu(double v) { return v / (1.0 + std::exp(-v)); }
// GELU, tanh form: 0.5 x (1 + tanh z), z = sqrt(2 / pi) (x + 0.044715 x^3), as x / (1 + e^(-2z)) (1 + tanh z
// cancels for z < -18).
double gelu(double v) { return v / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))); }

// y = x / sqrt(mean(x^2) + eps) * w over one group of n values.
void rmsnorm(const float* x, float* y, int64_t n, const float* w, double eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += double(x[i]) * x[i];
    double scale = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = float(x[i] * scale * w[i]);
}

// Q4_1/Q5_1 weights (x = d*q + m) meet Q8_1 activations through the block sum
// s = d_a * sum(q_a), which Q8_1 stores in f16.  The kernels use that stored s, so
// the exact dot of the quantized operands is the dequantized dot plus, per
// block, m * (s - d_a * sum(q_a)).
double q8_1_sum_correction(const uint8_t* wrow, uint32_t wtype, const uint8_t* act, int64_t k) {
    const size_t wb = size_t(type_traits(wtype).type_size);
    double c = 0.0;
    for (int64_t b = 0; b < k / QK8_1; b++) {
        const block_q8_1& a = ((const block_q8_1*)act)[b];
        uint16_t m;
        std::memcpy(&m, wrow + size_t(b) * wb + 2, 2);  // d, m are the first two f16 of Q4_1 and Q5_1
        int sum = 0;
        for (int i = 0; i < QK8_1; i++) sum += a.qs[i];
        c += double(f16_to_f32(m)) * (double(f16_to_f32(a.s)) - double(f16_to_f32(a.d)) * sum);
    }
    return c;
}

}  // namespace

bool ReferenceBackend::supports_op(const Node& node) const {
    switch (node.op) {
        case Op::FusedQKV: case Op::FusedQkvNorm: case Op::FusedFFN: case Op::FusedQkvRope: case Op::Count:
            return false;
        case Op::MatMul: case Op::GetRows:
            return weights_ && weights_->has(node.meta.weight);
        default:
            return true;
    }
}

void ReferenceBackend::execute_node(const Node& node, const ExecArgs& a) {
    const NodeMeta& m = node.meta;
    const int64_t rows = node.rows, cols = node.cols;
    auto in = [&](size_t i, int64_t r) { return at(a.in[i]) + r * a.in[i].ld; };
    auto out = [&](int64_t r) { return at(a.out) + r * a.out.ld; };
    switch (node.op) {
        case Op::Input:
            return;
        case Op::GetRows: {
            const Weight& w = weight(m.weight);
            for (int64_t r = 0; r < rows; r++) {
                int32_t id;
                std::memcpy(&id, in(0, r), 4);
                if (id < 0 || id >= w.rows())
                    throw MinferError(strfmt("token id %d is out of range for '%s' (%lld rows)", id, m.weight.c_str(),
                                             (long long)w.rows()));
                dequantize_row(w.type, w.data + size_t(id) * row_size(w.type, w.cols()), out(r), cols);
            }
            return;
        }
        case Op::TailRow: {
            std::vector<float> row(in(0, m.src_row), in(0, m.src_row) + cols);
            std::memcpy(out(0), row.data(), size_t(cols) * 4);
            return;
        }
        case Op::PickRows: {
            std::vector<float> picked;
            for (int64_t r = 0; r < rows; r++) {
                int32_t i;
                std::memcpy(&i, in(1, r), 4);
                if (i < 0 || i >= a.in[0].rows) throw MinferError(strfmt("PickRows: row %d of %lld", i, (long long)a.in[0].rows));
                picked.insert(picked.end(), in(0, i), in(0, i) + cols);
            }
            for (int64_t r = 0; r < rows; r++) std::memcpy(out(r), picked.data() + r * cols, size_t(cols) * 4);
            return;
        }
        case Op::RmsNorm:
        case Op::QkNorm: {
            const int64_t width = node.op == Op::RmsNorm ? cols : m.head_dim;
            const float* w = (const float*)weight(m.weight).data;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t g = 0; g < cols / width; g++) rmsnorm(in(0, r) + g * width, out(r) + g * width, width, w, m.eps);
            return;
        }
        case Op::MatMul: {
            const Weight& w = weight(m.weight);
            const uint32_t at_type = vec_dot_type(w.type);
            const int64_t k = w.cols();
            std::vector<uint8_t> q(row_size(at_type, k));
            std::vector<float> x((size_t)k), wr((size_t)k), y((size_t)cols);
            const float* bias = m.bias.empty() ? nullptr : (const float*)weight(m.bias).data;
            for (int64_t r = 0; r < rows; r++) {
                quantize_row_act(at_type, in(0, r), q.data(), k);
                dequantize_row(at_type, q.data(), x.data(), k);
                for (int64_t o = 0; o < cols; o++) {
                    const uint8_t* wrow = w.data + size_t(o) * row_size(w.type, k);
                    dequantize_row(w.type, wrow, wr.data(), k);
                    double s = 0.0;
                    for (int64_t i = 0; i < k; i++) s += double(wr[size_t(i)]) * x[size_t(i)];
                    if (at_type == GGML_TYPE_Q8_1) s += q8_1_sum_correction(wrow, w.type, q.data(), k);
                    y[size_t(o)] = float(s + (bias ? bias[o] : 0.0));
                }
                std::memcpy(out(r), y.data(), size_t(cols) * 4);
            }
            return;
        }
        case Op::Rope: {
            const int half = m.rope_dim / 2;
            for (int64_t r = 0; r < rows; r++) {
                int32_t p;
                std::memcpy(&p, in(1, r), 4);
                std::vector<float> x(in(0, r), in(0, r) + cols);
                for (int64_t h = 0; h < cols / m.head_dim; h++) {
                    float* xh = x.data() + h * m.head_dim;
                    for (int i = 0; i < half; i++) {
                        double theta = p * double(m.rope_scale) * std::pow(double(m.rope_base), -2.0 * i / m.rope_dim);
                        int i0 = m.rope_neox ? i : 2 * i, i1 = m.rope_neox ? i + half : 2 * i + 1;
                        double x0 = xh[i0], x1 = xh[i1];
                        xh[i0] = float(x0 * std::cos(theta) - x1 * std::sin(theta));
                        xh[i1] = float(x0 * std::sin(theta) + x1 * std::cos(theta));
                    }
                }
                std::memcpy(out(r), x.data(), size_t(cols) * 4);
            }
            return;
        }
        case Op::KvStore: {
            const int64_t dim = int64_t(m.n_head_kv) * m.head_dim;
            const size_t rb = kv_row_bytes(m.kv_type, dim);
            for (int64_t r = 0; r < rows; r++) {
                int32_t p;
                std::memcpy(&p, in(2, r), 4);
                if (p < 0 || p >= m.n_ctx)
                    throw MinferError(strfmt("KvStore: position %d is outside the KV cache of %d positions", p, m.n_ctx));
                const size_t row = size_t(m.kv_ring > 0 ? p % m.kv_ring : p);  // a local layer's ring
                kv_write_row(m.kv_type, in(0, r), (uint8_t*)ptr(a.kv_k) + row * rb, dim);
                kv_write_row(m.kv_type, in(1, r), (uint8_t*)ptr(a.kv_v) + row * rb, dim);
            }
            return;
        }
        case Op::Attn: {
            const int64_t dim = int64_t(m.n_head_kv) * m.head_dim;
            const size_t rb = kv_row_bytes(m.kv_type, dim);
            const int group = m.n_head / m.n_head_kv;
            std::vector<float> kr((size_t)(m.head_dim)), vr((size_t)(m.head_dim));
            for (int64_t r = 0; r < rows; r++) {
                int32_t p;
                std::memcpy(&p, in(1, r), 4);
                // key j's cache row: j itself, or (a batch step) through the row's sequence's block table
                const int ring = m.kv_ring;
                std::function<size_t(int)> row_of = [ring](int j) { return size_t(ring > 0 ? j % ring : j); };
                int max_pos = m.n_ctx;
                if (m.block_size > 0) {
                    int32_t seq;
                    std::memcpy(&seq, in(3, r), 4);
                    if (seq < 0 || seq >= a.in[4].rows)
                        throw MinferError(strfmt("Attn: row %lld has sequence %d of %lld", (long long)r, seq, (long long)a.in[4].rows));
                    const float* table = in(4, seq);
                    max_pos = int(a.in[4].ld) * m.block_size;
                    row_of = [&, table](int j) {
                        int32_t b;
                        std::memcpy(&b, table + j / m.block_size, 4);
                        if (b < 0 || int64_t(b) * m.block_size >= m.n_ctx)
                            throw MinferError(strfmt("Attn: block %d is outside the pool of %d blocks", b, m.n_ctx / m.block_size));
                        return size_t(b) * size_t(m.block_size) + size_t(j % m.block_size);
                    };
                }
                if (p < 0 || p >= max_pos)
                    throw MinferError(strfmt("Attn: position %d is outside the KV cache of %d positions", p, max_pos));
                for (int h = 0; h < m.n_head; h++) {
                    const int64_t col = int64_t(h / group) * m.head_dim;
                    const float* qh = in(0, r) + int64_t(h) * m.head_dim;
                    const int lo = m.window > 0 ? std::max(0, p - m.window + 1) : 0;  // the first key it sees
                    std::vector<double> s(size_t(p) + 1), o(size_t(m.head_dim), 0.0);
                    double mx = -INFINITY, sum = 0.0;
                    for (int j = lo; j <= p; j++) {
                        kv_read_row(m.kv_type, (const uint8_t*)ptr(a.kv_k) + row_of(j) * rb, col, kr.data(), m.head_dim);
                        double d = 0.0;
                        for (int i = 0; i < m.head_dim; i++) d += double(qh[i]) * kr[size_t(i)];
                        s[size_t(j)] = d * m.attn_scale;
                        mx = std::max(mx, s[size_t(j)]);
                    }
                    for (int j = lo; j <= p; j++) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
                    for (int j = lo; j <= p; j++) {
                        kv_read_row(m.kv_type, (const uint8_t*)ptr(a.kv_v) + row_of(j) * rb, col, vr.data(), m.head_dim);
                        for (int i = 0; i < m.head_dim; i++) o[size_t(i)] += s[size_t(j)] / sum * vr[size_t(i)];
                    }
                    for (int i = 0; i < m.head_dim; i++) out(r)[int64_t(h) * m.head_dim + i] = float(o[size_t(i)]);
                }
            }
            return;
        }
        case Op::Add: case Op::Mul: case Op::Silu: case Op::SwiGLU: case Op::Gelu: case Op::GeGLU: case Op::Scale:
        case Op::SoftCap: {
            const bool unary = node.op == Op::Silu || node.op == Op::Gelu || node.op == Op::Scale || node.op == Op::SoftCap;
            for (int64_t r = 0; r < rows; r++) {
                const float* x = in(0, r);
                const float* y = unary ? nullptr : in(1, r);
                float* o = out(r);
                for (int64_t i = 0; i < cols; i++) {
                    const double a = x[i];
                    double v = 0.0;
                    switch (node.op) {
                        case Op::Add: v = a + y[i]; break;
                        case Op::Mul: v = a * y[i]; break;
                        case Op::Silu: v = silu(a); break;
                        case Op::SwiGLU: v = silu(a) * y[i]; break;
                        case Op::Gelu: v = gelu(a); break;
                        case Op::GeGLU: v = gelu(a) * y[i]; break;
                        case Op::Scale: v = a * m.scale; break;
                        default: v = m.scale * std::tanh(a / m.scale); break;  // SoftCap
                    }
                    o[i] = float(v);
                }
            }
            return;
        }
        default:
            break;
    }
    throw MinferError(strfmt("reference backend cannot execute node '%s' (op %s)", node.name.c_str(), op_name(node.op)));
}

}  // namespace minfer
