#include "backends/cpu/cpu_backend.h"

#include <cstring>

#include "backends/cpu/attention.h"
#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"
#include "common/error.h"

namespace minfer {

CpuBackend::CpuBackend(const WeightStore* weights, std::shared_ptr<ThreadPool> pool, Isa isa)
    : HostBackend(weights), pool_(std::move(pool)), kernels_(&dot_kernels(isa)) {}

void CpuBackend::top_k_rows(int id, size_t offset, size_t n, int rows, size_t ld, int k, float* vals, int32_t* ids) {
    const float* x = ptr(id) + offset;
    if (offset + (rows > 0 ? size_t(rows - 1) * ld + n : 0) > buffer_size(id))
        throw MinferError(strfmt("top-k: %d rows of %zu past the end of buffer %d", rows, n, id));
    pool_->parallel_for(rows, [&](int64_t r, int) {
        best_of_row(x + size_t(r) * ld, n, k, vals + size_t(r) * size_t(k), ids + size_t(r) * size_t(k));
    });
}

// A batch step's greedy tokens: the rows in place over the thread pool (not copied out one at a time).
void CpuBackend::argmax_rows(int id, size_t offset, size_t n, int rows, size_t ld, int32_t* out, const uint32_t* allow) {
    const float* x = ptr(id) + offset;
    if (offset + (rows > 0 ? size_t(rows - 1) * ld + n : 0) > buffer_size(id))
        throw MinferError(strfmt("argmax: %d rows of %zu past the end of buffer %d", rows, n, id));
    const size_t words = (n + 31) / 32;
    pool_->parallel_for(rows, [&](int64_t r, int) {
        out[r] = argmax_of_row(x + size_t(r) * ld, n, allow ? allow + size_t(r) * words : nullptr);
    });
}

bool CpuBackend::supports_op(const Node& node) const {
    if (node.op == Op::MatMul || node.op == Op::GetRows) {
        const Weight* w = weights_ && weights_->has(node.meta.weight) ? &weights_->get(node.meta.weight) : nullptr;
        if (!w) return false;
        return node.op == Op::GetRows || kernels_->dot[w->type] != nullptr;
    }
    return node.op != Op::Count;
}

bool CpuBackend::supports_fused(Op fused) const {
    return fused == Op::SwiGLU || fused == Op::GeGLU || fused == Op::FusedQKV || fused == Op::FusedQkvNorm ||
           fused == Op::FusedFFN;
}

void CpuBackend::add_bias(const std::string& bias, float* y, int64_t ld, int64_t rows, int64_t cols) {
    if (bias.empty()) return;
    const float* b = (const float*)weight(bias).data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) y[r * ld + c] += b[c];
}

void CpuBackend::qkv(const Node& node, const ExecArgs& args) {
    const NodeMeta& m = node.meta;
    const Weight &wq = weight(m.wq), &wk = weight(m.wk), &wv = weight(m.wv);
    float* y = at(args.out);
    const int64_t ld = args.out.ld, rows = node.rows;
    MatJob jobs[3] = {{wq.data, wq.type, wq.rows(), y, ld},
                      {wk.data, wk.type, wk.rows(), y + m.q_cols, ld},
                      {wv.data, wv.type, wv.rows(), y + m.q_cols + m.k_cols, ld}};
    matmul_jobs(jobs, 3, wq.cols(), at(args.in[0]), args.in[0].ld, rows, *pool_, *kernels_);
    add_bias(m.bq, y, ld, rows, m.q_cols);
    add_bias(m.bk, y + m.q_cols, ld, rows, m.k_cols);
    add_bias(m.bv, y + m.q_cols + m.k_cols, ld, rows, m.v_cols);
    if (node.op == Op::FusedQkvNorm) {
        cpu_rmsnorm(y, ld, y, ld, rows, m.q_cols / m.head_dim, m.head_dim, (const float*)weight(m.q_norm).data, m.eps, *pool_);
        cpu_rmsnorm(y + m.q_cols, ld, y + m.q_cols, ld, rows, m.k_cols / m.head_dim, m.head_dim,
                    (const float*)weight(m.k_norm).data, m.eps, *pool_);
    }
}

void CpuBackend::ffn(const Node& node, const ExecArgs& args) {
    const Weight &wg = weight(node.meta.w_gate), &wu = weight(node.meta.w_up);
    const int64_t rows = node.rows, n_ff = node.cols;
    scratch_.resize(size_t(rows * n_ff));
    float* y = at(args.out);
    MatJob jobs[2] = {{wg.data, wg.type, wg.rows(), scratch_.data(), n_ff}, {wu.data, wu.type, wu.rows(), y, args.out.ld}};
    matmul_jobs(jobs, 2, wg.cols(), at(args.in[0]), args.in[0].ld, rows, *pool_, *kernels_);
    cpu_elementwise(node.meta.act == Act::Gelu ? Elementwise::GeGLU : Elementwise::SwiGLU, scratch_.data(), n_ff, y,
                    args.out.ld, y, args.out.ld, rows, n_ff, *pool_, *kernels_);
}

void CpuBackend::execute_node(const Node& node, const ExecArgs& a) {
    const NodeMeta& m = node.meta;
    const int64_t rows = node.rows, cols = node.cols;
    switch (node.op) {
        case Op::Input:
            return;
        case Op::GetRows: {
            const Weight& w = weight(m.weight);
            const int32_t* ids = (const int32_t*)at(a.in[0]);
            const size_t rb = row_size(w.type, w.cols());
            for (int64_t r = 0; r < rows; r++) {
                if (ids[r] < 0 || ids[r] >= w.rows())
                    throw MinferError(strfmt("token id %d is out of range for '%s' (%lld rows)", ids[r], m.weight.c_str(),
                                             (long long)w.rows()));
                dequantize_row(w.type, w.data + size_t(ids[r]) * rb, at(a.out) + r * a.out.ld, cols);
            }
            return;
        }
        case Op::TailRow:
            std::memmove(at(a.out), at(a.in[0]) + m.src_row * a.in[0].ld, size_t(cols) * sizeof(float));
            return;
        case Op::RmsNorm:
        case Op::QkNorm: {
            const int64_t width = node.op == Op::RmsNorm ? cols : m.head_dim;
            cpu_rmsnorm(at(a.in[0]), a.in[0].ld, at(a.out), a.out.ld, rows, cols / width, width,
                        (const float*)weight(m.weight).data, m.eps, *pool_);
            return;
        }
        case Op::MatMul: {
            const Weight& w = weight(m.weight);
            MatJob job{w.data, w.type, w.rows(), at(a.out), a.out.ld};
            matmul_jobs(&job, 1, w.cols(), at(a.in[0]), a.in[0].ld, rows, *pool_, *kernels_);
            add_bias(m.bias, at(a.out), a.out.ld, rows, cols);
            return;
        }
        case Op::Rope:
            cpu_rope(at(a.in[0]), a.in[0].ld, at(a.out), a.out.ld, rows, int(cols / m.head_dim), m.head_dim, m.rope_dim,
                     m.rope_base, m.rope_scale, m.rope_neox, (const int32_t*)at(a.in[1]), *pool_);
            return;
        case Op::KvStore: {
            KvLayout kv{m.kv_type, int64_t(m.n_head_kv) * m.head_dim, m.n_ctx, m.kv_ring};
            cpu_kv_store(at(a.in[0]), a.in[0].ld, at(a.in[1]), a.in[1].ld, rows, (const int32_t*)at(a.in[2]),
                         (uint8_t*)ptr(a.kv_k), (uint8_t*)ptr(a.kv_v), kv);
            return;
        }
        case Op::Attn: {
            KvLayout kv{m.kv_type, int64_t(m.n_head_kv) * m.head_dim, m.n_ctx, m.kv_ring};
            KvPages pages{};
            if (m.block_size > 0)
                pages = {(const int32_t*)at(a.in[3]), (const int32_t*)at(a.in[4]), int(a.in[4].rows), int(a.in[4].ld),
                         m.block_size};
            cpu_attention(at(a.in[0]), a.in[0].ld, at(a.out), a.out.ld, rows, (const int32_t*)at(a.in[1]),
                          (const uint8_t*)ptr(a.kv_k), (const uint8_t*)ptr(a.kv_v), kv, m.n_head, m.n_head_kv,
                          m.head_dim, m.attn_scale, m.window, *pool_, isa(), m.block_size > 0 ? &pages : nullptr);
            return;
        }
        case Op::PickRows: {
            const int32_t* idx = (const int32_t*)at(a.in[1]);
            for (int64_t r = 0; r < rows; r++) {
                if (idx[r] < 0 || idx[r] >= a.in[0].rows)
                    throw MinferError(strfmt("PickRows: row %d of %lld", idx[r], (long long)a.in[0].rows));
                std::memcpy(at(a.out) + r * a.out.ld, at(a.in[0]) + idx[r] * a.in[0].ld, size_t(cols) * sizeof(float));
            }
            return;
        }
        case Op::Add: case Op::Mul: case Op::Silu: case Op::SwiGLU: case Op::Gelu: case Op::GeGLU: case Op::Scale:
        case Op::SoftCap: {
            const Elementwise f = node.op == Op::Add ? Elementwise::Add : node.op == Op::Mul ? Elementwise::Mul
                                : node.op == Op::Silu ? Elementwise::Silu : node.op == Op::SwiGLU ? Elementwise::SwiGLU
                                : node.op == Op::Gelu ? Elementwise::Gelu : node.op == Op::GeGLU ? Elementwise::GeGLU
                                : node.op == Op::Scale ? Elementwise::Scale : Elementwise::SoftCap;
            const bool binary = node.op == Op::Add || node.op == Op::Mul || node.op == Op::SwiGLU || node.op == Op::GeGLU;
            cpu_elementwise(f, at(a.in[0]), a.in[0].ld, binary ? at(a.in[1]) : nullptr, binary ? a.in[1].ld : 0, at(a.out),
                            a.out.ld, rows, cols, *pool_, *kernels_, m.scale);
            return;
        }
        case Op::FusedQKV:
        case Op::FusedQkvNorm:
            return qkv(node, a);
        case Op::FusedFFN:
            return ffn(node, a);
        case Op::RopeKvStore: case Op::AddRmsNorm: case Op::FusedQkvRope:  // GPU fusions (supports_fused says no)
        case Op::Count:
            break;
    }
    throw MinferError(strfmt("cpu backend cannot execute node '%s' (op %s)", node.name.c_str(), op_name(node.op)));
}

}  // namespace minfer
