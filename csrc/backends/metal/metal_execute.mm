// The Metal backend's encoding of each node (metal_backend.h): x W^T on the matvec tiers or the simdgroup-matrix
// GEMM (fused q/k/v and gate/up parts sharing a dispatch where they can), the embedding gather, norms, RoPE and
// the KV store, attention (single-pass flash or KV-split with a combine) and elementwise ops; every dispatch's
// shape checked against its buffers by MetalBackend::dispatch.  Reference: tests/test_metal_kernels.py (the
// kernels in the MSL emulator), tests/test_metal_mock.py (this host on a mock device).
#include "backends/metal/metal_backend.h"

namespace minfer::metal_host {

// Threads of an RMSNorm threadgroup: one simdgroup for a head, more for a whole row.
static uint norm_threads(uint width) { return width >= 1024 ? 256 : width >= 256 ? 128 : 32; }

// One dispatch of a matvec tier over n parts that share a type and a buffer (so one kernel reads them all at
// byte offsets from the lowest); their biases, if any, likewise from one buffer.
void MetalBackend::matvec_group(const char* tier, uint rows, const BufRef& x, const Bound& out, uint y_ld,
                                const Part* p, size_t n, bool swiglu) {
    const MetalWeight& w0 = *p[0].w;
    const uint K = uint(w0.cols), rb = uint(w0.nbytes / size_t(w0.rows));
    size_t lo = SIZE_MAX, hi = 0, blo = SIZE_MAX, bhi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = std::min(lo, p[i].w->offset);
        hi = std::max(hi, p[i].w->offset + p[i].w->nbytes);
        if (p[i].bias) {
            blo = std::min(blo, p[i].bias->offset);
            bhi = std::max(bhi, p[i].bias->offset + size_t(p[i].n) * 4);
        }
    }
    uint w_off[3] = {0, 0, 0}, b_off[3] = {0, 0, 0}, end[3] = {0, 0, 0}, total = 0;
    for (size_t i = 0; i < n; i++) {
        w_off[i] = uint(p[i].w->offset - lo);
        if (p[i].bias) b_off[i] = uint((p[i].bias->offset - blo) / 4);
        total = swiglu ? p[0].n : total + p[i].n;
        end[i] = total;
    }
    const bool bias = p[0].bias != nullptr;
    MatvecArgs mv{K, total, rb, uint(x.ld), y_ld, rows, n > 1 && !swiglu ? end[0] : total,
                  n > 2 ? end[1] : total, w_off[0], w_off[1], w_off[2], bias ? 1u : 0u, b_off[0], b_off[1], b_off[2],
                  swiglu ? 1u : 0u};
    const Bound wb{w0.buffer, lo, hi - lo};
    const Bound bb = bias ? Bound{p[0].bias->buffer, blo, bhi - blo} : wb;  // unread without a bias
    const bool small = std::strcmp(tier, "matvec") == 0;
    const std::string k = std::string(tier) + "_" + type_suffix(w0.type);
    dispatch(k.c_str(), &mv, sizeof mv, {wb, at(x, rows, K), out, bb},
             MTLSizeMake((total + 3) / 4, small ? rows : (rows + 7) / 8, 1), MTLSizeMake(128, 1, 1));
}

// x W^T (+ bias) for one weight or a fused set: q|k|v into adjacent column windows, or gate/up with SwiGLU.
// Decode and small batches: the matvec tiers, parts that can share a dispatch sharing one; larger batches:
// the simdgroup-matrix GEMM per part, then the bias and SwiGLU elementwise.
void MetalBackend::project(const Node& node, const ExecArgs& a, const std::vector<Part>& parts, bool swiglu) {
    const uint rows = uint(node.rows), K = uint(parts[0].w->cols);
    for (const Part& p : parts)
        if (uint(p.w->cols) != K)
            throw MinferError(strfmt("Metal '%s': fused weights of different widths", node.name.c_str()));
    const uint y_ld = uint(a.out.ld);
    auto window = [&](uint col, uint n) {  // columns [col, col + n) of the output
        BufRef r = a.out;
        r.offset += col;
        return at(r, rows, n);
    };
    const uint up_n = swiglu ? parts[1].n : 0;
    id<MTLBuffer> up = nil;  // where the up projection goes when it is not fused with the gate
    if (rows < mm_min_rows_) {
        const char* tier = rows < rows_min_ ? "matvec" : "matmul_rows";
        auto joins = [&](const Part& g, const Part& p) {  // can p share g's dispatch?
            return p.w->type == g.w->type && p.w->buffer == g.w->buffer && (p.bias != nullptr) == (g.bias != nullptr) &&
                   (!p.bias || p.bias->buffer == g.bias->buffer) && p.w->nbytes / size_t(p.w->rows) == g.w->nbytes / size_t(g.w->rows) &&
                   std::max(p.w->offset + p.w->nbytes, g.w->offset + g.w->nbytes) - std::min(p.w->offset, g.w->offset) <= UINT32_MAX;
        };
        if (swiglu && joins(parts[0], parts[1]))
            return matvec_group(tier, rows, a.in[0], window(0, parts[0].n), y_ld, parts.data(), 2, true);
        if (swiglu) {  // gate into the output, up into scratch, then silu(gate) * up
            up = scratch(size_t(rows) * up_n * 4);
            matvec_group(tier, rows, a.in[0], window(0, parts[0].n), y_ld, &parts[0], 1, false);
            matvec_group(tier, rows, a.in[0], Bound{up, 0, size_t(rows) * up_n * 4}, up_n, &parts[1], 1, false);
        } else {
            for (size_t i = 0; i < parts.size();) {  // consecutive parts that can share a dispatch
                size_t n = 1;
                while (i + n < parts.size() && n < 3 && joins(parts[i], parts[i + n])) n++;
                uint width = 0;
                for (size_t j = i; j < i + n; j++) width += parts[j].n;
                matvec_group(tier, rows, a.in[0], window(parts[i].y_col, width), y_ld, &parts[i], n, false);
                i += n;
            }
            return;
        }
    } else {
        if (swiglu) up = scratch(size_t(rows) * up_n * 4);
        for (size_t i = 0; i < parts.size(); i++) {  // the simdgroup-matrix tier: 32 x 64 output tiles
            const Part& p = parts[i];
            const MetalWeight& w = *p.w;
            const size_t rb = w.nbytes / size_t(w.rows);
            const bool to_up = swiglu && i == 1;
            const Bound dst = to_up ? Bound{up, 0, size_t(rows) * up_n * 4} : window(p.y_col, p.n);
            MatmulArgs mm{K, p.n, rows, uint(rb), uint(a.in[0].ld), to_up ? up_n : y_ld};
            const std::string k = std::string("matmul_mm_") + type_suffix(w.type);
            dispatch(k.c_str(), &mm, sizeof mm, {Bound{w.buffer, w.offset, rb * p.n}, at(a.in[0], rows, K), dst},
                     MTLSizeMake((p.n + 63) / 64, (rows + 31) / 32, 1), MTLSizeMake(128, 1, 1),
                     {64 * 32 * 4, 32 * 32 * 4, 32 * 64 * 4});
            if (p.bias) {
                EwArgs e{p.n, y_ld, 0, y_ld, EW_ADD, 1.0f};  // b_ld 0: the bias row for every row
                dispatch("elementwise", &e, sizeof e, {dst, Bound{p.bias->buffer, p.bias->offset, p.n * 4}, dst},
                         MTLSizeMake((p.n + 255) / 256, rows, 1), MTLSizeMake(256, 1, 1));
            }
        }
        if (!swiglu) return;
    }
    const Bound g = window(0, parts[0].n), u{up, 0, size_t(rows) * up_n * 4};
    EwArgs e{up_n, y_ld, up_n, y_ld, EW_SWIGLU, 1.0f};
    dispatch("elementwise", &e, sizeof e, {g, u, g}, MTLSizeMake((up_n + 255) / 256, rows, 1), MTLSizeMake(256, 1, 1));
}

void MetalBackend::execute_node(const Node& node, const ExecArgs& a) {
    usable();
    const NodeMeta& m = node.meta;
    const uint rows = uint(node.rows), cols = uint(node.cols);
    auto in = [&](size_t i, int64_t c) { return at(a.in[i], node.rows, c); };
    const Bound out = at(a.out, node.rows, node.cols);
    const Bound err{err_, 0, 4};
    switch (node.op) {
        case Op::Input:
            return;
        case Op::GetRows: {
            const MetalWeight& w = weight(m.weight);
            GetRowsArgs g{uint(w.cols), uint(w.nbytes / size_t(w.rows)), uint(w.rows), uint(a.out.ld)};
            const std::string k = std::string("get_rows_") + type_suffix(w.type);
            return dispatch(k.c_str(), &g, sizeof g, {Bound{w.buffer, w.offset, w.nbytes}, in(0, 1), out, err},
                            MTLSizeMake((w.cols / 8 + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::PickRows: {  // each sequence's row: the gather of get_rows over f32 activations
            const BufRef& x = a.in[0];
            GetRowsArgs g{cols, uint(x.ld * 4), uint(x.rows), uint(a.out.ld)};
            return dispatch("get_rows_f32", &g, sizeof g, {at(x, x.rows, cols), in(1, 1), out, err},
                            MTLSizeMake((cols / 8 + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::TailRow: {
            EwArgs e{cols, uint(a.in[0].ld), uint(a.in[0].ld), uint(a.out.ld), EW_COPY, 1.0f};
            BufRef src = a.in[0];
            src.offset += int64_t(m.src_row) * src.ld;
            const Bound s = at(src, 1, cols);
            return dispatch("elementwise", &e, sizeof e, {s, s, out}, MTLSizeMake((cols + 255) / 256, 1, 1),
                            MTLSizeMake(256, 1, 1));
        }
        case Op::RmsNorm: case Op::QkNorm: {
            const uint width = node.op == Op::RmsNorm ? cols : uint(m.head_dim);
            const MetalWeight& w = weight(m.weight);
            NormArgs n{width, uint(a.in[0].ld), uint(a.out.ld), m.eps};
            const uint threads = norm_threads(width);
            return dispatch("rms_norm", &n, sizeof n, {in(0, cols), Bound{w.buffer, w.offset, width * 4}, out},
                            MTLSizeMake(rows, cols / width, 1), MTLSizeMake(threads, 1, 1), {threads / 32 * 4});
        }
        case Op::AddRmsNorm: {
            const uint width = cols / 2;
            const MetalWeight& w = weight(m.weight);
            AddNormArgs n{width, uint(a.in[0].ld), uint(a.in[1].ld), uint(a.out.ld), m.eps};
            const uint threads = norm_threads(width);
            return dispatch("add_rms_norm", &n, sizeof n,
                            {in(0, width), in(1, width), Bound{w.buffer, w.offset, width * 4}, out},
                            MTLSizeMake(rows, 1, 1), MTLSizeMake(threads, 1, 1), {threads / 32 * 4});
        }
        case Op::MatMul:
            return project(node, a, {part(m.weight, m.bias, cols, 0)}, false);
        case Op::FusedQKV: case Op::FusedQkvNorm: {
            const uint qc = uint(m.q_cols), kc = uint(m.k_cols);
            project(node, a, {part(m.wq, m.bq, qc, 0), part(m.wk, m.bk, kc, qc), part(m.wv, m.bv, uint(m.v_cols), qc + kc)},
                    false);
            if (node.op == Op::FusedQKV) return;
            for (int which = 0; which < 2; which++) {  // qwen3's per-head norms of q and k, in place
                const MetalWeight& w = weight(which ? m.k_norm : m.q_norm);
                const uint width = uint(m.head_dim), c0 = which ? qc : 0, n = which ? kc : qc;
                BufRef win = a.out;
                win.offset += c0;
                NormArgs na{width, uint(a.out.ld), uint(a.out.ld), m.eps};
                const uint threads = norm_threads(width);
                const Bound b = at(win, node.rows, n);
                dispatch("rms_norm", &na, sizeof na, {b, Bound{w.buffer, w.offset, width * 4}, b},
                         MTLSizeMake(rows, n / width, 1), MTLSizeMake(threads, 1, 1), {threads / 32 * 4});
            }
            return;
        }
        case Op::FusedFFN:
            return project(node, a, {part(m.w_gate, "", cols, 0), part(m.w_up, "", cols, 0)}, true);
        case Op::RopeKvStore: {
            const uint dim = uint(m.n_head_kv * m.head_dim);
            const bool paged = a.in.size() > 4;  // a batch step: each row's pool row, input 4
            RopeStoreArgs r{cols, dim, uint(m.head_dim), uint(m.rope_dim), m.rope_neox ? 1u : 0u, uint(a.in[0].ld),
                            uint(a.in[1].ld), uint(a.in[2].ld), uint(a.out.ld), uint(m.n_ctx), uint(m.kv_type),
                            uint(m.kv_ring), paged ? 1u : 0u};
            id<MTLBuffer> f = rope_freqs(m.rope_dim, m.rope_base, m.rope_scale);
            return dispatch("rope_kv_store", &r, sizeof r,
                            {in(0, cols), in(1, dim), in(2, dim), in(3, 1), Bound{f, 0, size_t(m.rope_dim / 2) * 4}, out,
                             whole(a.kv_k), whole(a.kv_v), err, in(paged ? 4 : 3, 1)},
                            MTLSizeMake(rows, 1, 1), MTLSizeMake(128, 1, 1), {dim * 4});
        }
        case Op::Rope: {
            RopeArgs r{cols, uint(m.head_dim), uint(m.rope_dim), uint(a.in[0].ld), uint(a.out.ld), m.rope_neox ? 1u : 0u};
            id<MTLBuffer> f = rope_freqs(m.rope_dim, m.rope_base, m.rope_scale);
            return dispatch("rope", &r, sizeof r, {in(0, cols), in(1, 1), Bound{f, 0, size_t(m.rope_dim / 2) * 4}, out},
                            MTLSizeMake((cols / 2 + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::KvStore: {
            const uint dim = uint(m.n_head_kv * m.head_dim);
            KvStoreArgs k{dim, uint(m.n_ctx), uint(a.in[0].ld), uint(a.in[1].ld), uint(m.kv_type), uint(m.kv_ring)};
            return dispatch("kv_store", &k, sizeof k, {in(0, dim), in(1, dim), in(2, 1), whole(a.kv_k), whole(a.kv_v), err},
                            MTLSizeMake((dim + 63) / 64, rows, 1), MTLSizeMake(64, 1, 1));
        }
        case Op::Attn: {
            if (m.block_size > 0) {  // a batch step: rows of several sequences over the pool's blocks
                const uint bs = uint(m.block_size), max_blocks = uint(a.in[4].ld), n_seqs = uint(a.in[4].rows);
                PagedAttnArgs t{uint(m.n_head), uint(m.n_head_kv), uint(m.head_dim), uint(a.in[0].ld), uint(a.out.ld),
                                uint(m.kv_type), m.attn_scale, uint(m.window), bs, uint(m.n_ctx) / bs, max_blocks, n_seqs};
                return dispatch("attention_paged", &t, sizeof t,
                                {in(0, cols), in(1, 1), in(3, 1), at(a.in[4], n_seqs, max_blocks), whole(a.kv_k),
                                 whole(a.kv_v), out},
                                MTLSizeMake(uint(m.n_head), rows, 1), MTLSizeMake(128, 1, 1), {128 * 4, 4 * 4});
            }
            const uint S = (uint(m.n_ctx) + 511) / 512;  // one split per 512 cached positions (fixed by n_ctx)
            AttnArgs t{uint(m.n_head), uint(m.n_head_kv), uint(m.head_dim), uint(m.n_ctx), uint(a.in[0].ld),
                       uint(a.out.ld), uint(m.kv_type), m.attn_scale, S, rows, uint(m.window), uint(m.kv_ring)};
            const uint hd = uint(m.head_dim);
            if (rows >= 16 && m.kv_type == GGML_TYPE_F16 && hd % 8 == 0 && hd <= 128) {  // prefill on simdgroup matrices
                return dispatch("attention_prefill", &t, sizeof t,
                                {in(0, cols), in(1, 1), whole(a.kv_k), whole(a.kv_v), out},
                                MTLSizeMake(uint(m.n_head), (rows + 7) / 8, 1), MTLSizeMake(128, 1, 1),
                                {8 * hd * 4, 16 * hd * 4, 16 * hd * 4, 8 * 16 * 4, 8 * hd * 4, 3 * 8 * 4});
            }
            if (rows == 1 && S > 1 && attn_split_) {  // decode over a long cache: flash decoding
                const size_t floats = size_t(m.n_head) * S * size_t(m.head_dim + 2);
                if (!partial_ || [partial_ length] < floats * 4)
                    partial_ = [dev_.device newBufferWithLength:floats * 4 options:MTLResourceStorageModeShared];
                dispatch("attention_split", &t, sizeof t,
                         {in(0, cols), in(1, 1), whole(a.kv_k), whole(a.kv_v), Bound{partial_, 0, floats * 4}},
                         MTLSizeMake(uint(m.n_head), 1, S), MTLSizeMake(128, 1, 1), {128 * 4, 4 * 4});
                return dispatch("attention_combine", &t, sizeof t, {Bound{partial_, 0, floats * 4}, out},
                                MTLSizeMake(uint(m.n_head), 1, 1), MTLSizeMake(64, 1, 1));
            }
            return dispatch("attention", &t, sizeof t, {in(0, cols), in(1, 1), whole(a.kv_k), whole(a.kv_v), out},
                            MTLSizeMake(uint(m.n_head), rows, 1), MTLSizeMake(128, 1, 1), {128 * 4, 4 * 4});
        }
        case Op::Add: case Op::Mul: case Op::Silu: case Op::SwiGLU: case Op::Gelu: case Op::GeGLU: case Op::Scale:
        case Op::SoftCap: {
            const uint op = node.op == Op::Add ? EW_ADD : node.op == Op::Mul ? EW_MUL : node.op == Op::Silu ? EW_SILU
                          : node.op == Op::SwiGLU ? EW_SWIGLU : node.op == Op::Gelu ? EW_GELU
                          : node.op == Op::GeGLU ? EW_GEGLU : node.op == Op::Scale ? EW_SCALE : EW_SOFTCAP;
            const bool binary = node.op == Op::Add || node.op == Op::Mul || node.op == Op::SwiGLU || node.op == Op::GeGLU;
            EwArgs e{cols, uint(a.in[0].ld), binary ? uint(a.in[1].ld) : 0u, uint(a.out.ld), op, m.scale};
            const Bound b = binary ? in(1, cols) : in(0, cols);
            return dispatch("elementwise", &e, sizeof e, {in(0, cols), b, out}, MTLSizeMake((cols + 255) / 256, rows, 1),
                            MTLSizeMake(256, 1, 1));
        }
        default:
            throw MinferError(strfmt("Metal backend cannot execute node '%s' (op %s)", node.name.c_str(), op_name(node.op)));
    }
}

}  // namespace minfer::metal_host
