// The CUDA backend's execution of one node: projections (decode matvec or prefill GEMM, fused parts), norms,
// RoPE and the KV store, attention and elementwise ops, each enqueued on the backend's stream.  Reference:
// tests/test_cuda.py (each op against the reference backend; forward passes against the CPU and llama.cpp).
#include "backends/cuda/cuda_backend.cuh"
#include "backends/cuda/mma_act.cuh"

namespace minfer::cuda_host {

CudaBackend::Proj CudaBackend::proj(const std::string& w, const std::string& bias, int64_t n_out, int64_t y_col) const {
    const DevWeight& dw = weight(w);
    if (n_out > dw.rows)
        throw MinferError(strfmt("CUDA: %lld outputs from weight '%s' of %lld rows", (long long)n_out, w.c_str(),
                                 (long long)dw.rows));
    return Proj{&dw, bias.empty() ? nullptr : (const float*)weight(bias).p, n_out, y_col};
}

// A batch step's products (2-64 rows): two rows of Q4_K/Q6_K weights the 8-bit matvec's rows kernel, which
// streams each weight once for both rows as decode does for one; from kGemmMmaMinRows the bf16 tensor cores
// on shared-memory stages (gemm_mma: Q4_K, Q6_K, Q8_0); other types int8 on 8-bit activations (gemm_q8).
// cuda.batch_matmul forces one, or f16 (gemm_q); a forced kernel these weights lack is an error.
bool CudaBackend::takes_mma(int rows) const {
    const std::string choice = forced_kernel("cuda.batch_matmul");
    return rows > 1 && rows <= cuda::kGemmMmaMaxRows &&
           (choice == "bf16" || (choice.empty() && rows >= cuda::kGemmMmaMinRows));
}

// Scratch for a batch product's bf16 activations that the node before it writes: where the projection reading
// them (its first weight w) takes gemm_mma at `rows` rows of K; else none.
cuda::MmaAct CudaBackend::mma_act_for(const std::string& w, int rows, int64_t K) {
    if (w.empty() || !takes_mma(rows) || K % cuda::kMmaChunk) return {};
    auto it = weights_.find(w);
    if (it == weights_.end() || !cuda::gemm_mma_fits(it->second.type, rows, K)) return {};
    return {scratch(qscratch_, qscratch_n_, (cuda::mma_act_bytes(rows, K) + 3) / 4), rows};
}

bool CudaBackend::project(const Node& node, const ExecArgs& a, const std::vector<Proj>& parts, bool swiglu,
                          const cuda::QkvRopeEpilogue* rope) {
    const int64_t K = parts[0].w->cols;
    for (const Proj& p : parts)
        if (p.w->cols != K) throw MinferError(strfmt("CUDA '%s': fused weights of different widths", node.name.c_str()));
    const int rows = node.rows;
    const float* x = at(a.in[0]);
    int64_t ldx = a.in[0].ld;
    float* y = at(a.out);
    const int64_t ldy = a.out.ld;
    float* up = nullptr;  // a SwiGLU pair's up half
    // The gate's product times it, in place (and in gemm_mma's layout for the down projection, where xb.p).
    auto apply_glu = [&](const cuda::MmaAct& xb) {
        const int64_t n = parts[1].n_out;
        cuda::elementwise(node.meta.act == Act::Gelu ? Ew::GeGLU : Ew::SwiGLU, y, ldy, up, n, y, ldy, rows, int(n),
                          stream_, 1.0f, xb);
        if (xb.p) premma_ = Prequant{y, ldy, n, rows, xb.p};
    };
    // The matrix paths' loop: each part's product into its columns of y (a SwiGLU pair's up half into scratch,
    // then apply_glu), K split where splits_of says: run(part, y, ldy, bias, partial).
    auto each_part = [&](auto splits_of, auto run) {
        if (swiglu) up = scratch(fscratch_, fscratch_n_, size_t(rows) * size_t(parts[1].n_out));
        for (size_t i = 0; i < parts.size(); i++) {
            const Proj& p = parts[i];
            const int splits = splits_of(p);
            float* partial = splits > 1 ? scratch(kscratch_, kscratch_n_, size_t(splits) * size_t(rows) * size_t(p.n_out))
                                        : nullptr;
            if (swiglu && i == 1) run(p, up, p.n_out, nullptr, partial);
            else run(p, y + p.y_col, ldy, p.bias, partial);
        }
        if (swiglu) apply_glu(mma_act_for(node.meta.feeds, rows, parts[1].n_out));
        return false;
    };
    const std::string choice = forced_kernel("cuda.batch_matmul");
    auto all_parts = [&](bool (*fits)(uint32_t, int64_t, int64_t)) {
        for (const Proj& p : parts)
            if (!fits(p.w->type, rows, K)) return false;
        return true;
    };
    const bool bf16 = takes_mma(rows) && all_parts(cuda::gemm_mma_fits);
    const bool two_rows = rows > 1 && !bf16 && (choice == "matvec" || (choice.empty() && decode_q8_)) &&
                          all_parts(cuda::matvec_q8_rows_fits);
    const bool mma = rows > 1 && !bf16 && !two_rows && (choice == "int8" || (choice.empty() && decode_q8_)) &&
                     all_parts(cuda::gemm_q8_fits);
    if (rows > 1 && rows <= cuda::kGemmQ8MaxRows &&
        ((choice == "int8" && !mma) || (choice == "bf16" && !bf16) || (choice == "matvec" && !two_rows)))
        throw MinferError(strfmt("CUDA '%s': cuda.batch_matmul=%s, but %d rows of these weights have no such product",
                                 node.name.c_str(), choice.c_str(), rows));
    if (bf16) {  // x in bf16, laid out by mma_act (or already, by the kernel before)
        // weights of one type in one launch (q, k and v; gate and up: one tail of a wave, not one each)
        const uint32_t type = parts[0].w->type;
        bool one_type = parts.size() <= size_t(cuda::kMmaMaxParts);
        for (const Proj& p : parts) one_type = one_type && p.w->type == type;
        // x's bf16 and the down projection's (which the sum of gate's and up's K ranges may write) share one
        // scratch: sized for both first, so that neither request grows it under the other
        const int64_t n_down = one_type && swiglu ? parts[1].n_out : 0;
        scratch(qscratch_, qscratch_n_,
                (std::max(cuda::mma_act_bytes(rows, K), cuda::mma_act_bytes(rows, n_down)) + 3) / 4);
        const cuda::MmaAct next = n_down ? mma_act_for(node.meta.feeds, rows, n_down) : cuda::MmaAct{};
        void* xb = scratch(qscratch_, qscratch_n_, (cuda::mma_act_bytes(rows, K) + 3) / 4);
        if (!pending_mma_.of(x, ldx, K, rows, xb)) cuda::mma_act(x, ldx, rows, K, xb, stream_);
        if (one_type) {
            if (swiglu) up = scratch(fscratch_, fscratch_n_, size_t(rows) * size_t(parts[1].n_out));
            cuda::MmaPart mp[cuda::kMmaMaxParts];
            const int n = int(parts.size());
            for (int i = 0; i < n; i++) {
                const Proj& p = parts[size_t(i)];
                const bool into_up = swiglu && i == 1;
                mp[i] = {p.w->p, p.n_out, into_up ? up : y + p.y_col, into_up ? p.n_out : ldy, into_up ? nullptr : p.bias};
            }
            const size_t need = cuda::gemm_mma_partial_floats(type, rows, mp, n, K);
            float* partial = need ? scratch(kscratch_, kscratch_n_, need) : nullptr;
            const int glu = swiglu ? (node.meta.act == Act::Gelu ? 2 : 1) : 0;
            if (cuda::gemm_mma(type, xb, rows, K, mp, n, partial, split_counters_, stream_, glu, next)) {
                if (next.p) premma_ = Prequant{y, ldy, parts[1].n_out, rows, next.p};
            } else if (swiglu) {
                apply_glu(next);
            }
            return false;
        }
        return each_part([&](const Proj& p) { return cuda::gemm_mma_splits(p.w->type, rows, p.n_out, K); },
                         [&](const Proj& p, float* out, int64_t ld, const float* bias, float* partial) {
                             cuda::gemm_mma(p.w->type, xb, rows, K, p.w->p, p.n_out, out, ld, bias, partial,
                                            split_counters_, stream_);
                         });
    }
    if (mma) {
        const cuda::Q8Act xq =
            cuda::q8_act(scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, K) + 3) / 4), rows, K);
        if (!pending_.of(x, ldx, K, rows, xq.q)) cuda::quantize_q8(x, ldx, rows, K, xq, stream_);
        return each_part([&](const Proj& p) { return cuda::gemm_q8_splits(p.w->type, rows, p.n_out, K); },
                         [&](const Proj& p, float* out, int64_t ld, const float* bias, float* partial) {
                             cuda::gemm_q8(p.w->type, xq, rows, K, p.w->p, p.n_out, out, ld, bias, partial, stream_);
                         });
    }
    if (rows <= kMatvecMaxRows) {  // decode (or a batch's two rows): weights streamed once
        MatvecArgs m;
        m.n_parts = int(parts.size());
        m.swiglu = swiglu;
        m.gelu = swiglu && node.meta.act == Act::Gelu;
        m.K = K;
        bool q8 = decode_q8_ || two_rows;
        for (size_t i = 0; i < parts.size(); i++) {
            m.part[i] = MatvecPart{parts[i].w->p, parts[i].bias, row_bytes(parts[i].w->type, K), parts[i].w->type,
                                   parts[i].n_out, parts[i].y_col};
            q8 = q8 && cuda::matvec_q8_supported(parts[i].w->type, K);
        }
        m.n_rows = rows;
        m.y = y;
        m.ldy = ldy;
        if (q8) {  // activations rounded to 8 bits once, integer dot products
            m.x = x;
            m.ldx = ldx;
            float* sc = scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, K) + 3) / 4);
            const bool ready = pending_.of(x, ldx, K, rows, sc);
            if (rope) {
                m.rope = *rope;
                if (!cuda::matvec_q8_rope_fusable(m)) m.rope = cuda::QkvRopeEpilogue{};
            }
            cuda::matvec_q8(m, sc, ready, stream_);
            return m.rope.pos != nullptr;
        }
        if (uintptr_t(x) % 16 || ldx % 4) {  // f32 activations; a column window at an odd offset: copy to aligned rows
            float* xa = scratch(fscratch_, fscratch_n_, size_t(rows) * size_t(K));
            cuda::copy_rows(x, ldx, xa, K, rows, int(K), stream_);
            x = xa;
            ldx = K;
        }
        m.x = x;
        m.ldx = ldx;
        cuda::matvec(m, stream_);
        return false;
    }
    if (cuda::gemm_q_fits(rows, K)) {  // a batch's decode step: each weight read once, dequantized in shared memory
        __half* xh = scratch(xscratch_, xscratch_n_, size_t(int64_t(rows) * K));
        cuda::convert_f16(x, ldx, rows, K, xh, stream_);
        return each_part([&](const Proj& p) { return cuda::gemm_q_splits(rows, p.n_out, K); },
                         [&](const Proj& p, float* out, int64_t ld, const float* bias, float* partial) {
                             cuda::gemm_q(p.w->type, xh, rows, p.w->p, p.n_out, K, out, ld, bias, partial, stream_);
                         });
    }
    // prefill: each weight dequantized to f16 once, then the tensor-core GEMM
    int64_t max_n = 0;
    for (const Proj& p : parts) max_n = std::max(max_n, p.n_out);
    __half* wh = scratch(wscratch_, wscratch_n_, size_t(max_n * K));
    __half* xh = scratch(xscratch_, xscratch_n_, size_t(int64_t(rows) * K));
    cuda::convert_f16(x, ldx, rows, K, xh, stream_);
    return each_part([&](const Proj& p) { return gemm_splits(rows, p.n_out, K); },
                     [&](const Proj& p, float* out, int64_t ld, const float* bias, float* partial) {
                         cuda::dequantize_f16(p.w->type, p.w->p, p.n_out, K, wh, stream_);
                         cuda::gemm_f16(xh, wh, rows, p.n_out, K, out, ld, bias, partial, stream_);
                     });
}

void CudaBackend::execute_node(const Node& node, const ExecArgs& a) {
    usable();
    pending_ = prequant_;  // valid for this node only
    prequant_ = Prequant{};
    pending_mma_ = premma_;
    premma_ = Prequant{};
    recent_[recent_at_] = node.name;
    recent_at_ = (recent_at_ + 1) % recent_.size();
    const NodeMeta& m = node.meta;
    const int rows = node.rows, cols = node.cols;
    auto ld = [&](size_t i) { return a.in[i].ld; };
    auto qkv_parts = [&] {  // FusedQKV, FusedQkvNorm, FusedQkvRope: q, k, v side by side
        return std::vector<Proj>{proj(m.wq, m.bq, m.q_cols, 0), proj(m.wk, m.bk, m.k_cols, m.q_cols),
                                 proj(m.wv, m.bv, m.v_cols, m.q_cols + m.k_cols)};
    };
    switch (node.op) {
        case Op::Input:
            return;
        case Op::GetRows: {
            const DevWeight& w = weight(m.weight);
            return cuda::get_rows(w.type, w.p, w.rows, w.cols, (const int32_t*)at(a.in[0]), rows, at(a.out), a.out.ld,
                                  err_dev_, stream_);
        }
        case Op::PickRows:
            return cuda::pick_rows(at(a.in[0]), ld(0), int(a.in[0].rows), (const int32_t*)at(a.in[1]), at(a.out), a.out.ld,
                                   rows, cols, err_dev_, stream_);
        case Op::TailRow:
            return cuda::copy_rows(at(a.in[0]) + int64_t(m.src_row) * ld(0), ld(0), at(a.out), a.out.ld, 1, cols, stream_);
        case Op::RmsNorm: case Op::QkNorm: {
            cuda::Q8Act q8;  // decode's whole-row norm: also the next projection's 8-bit activations
            if (node.op == Op::RmsNorm && decode_q8_ && rows <= kMatvecMaxRows && cols % 64 == 0)
                q8 = cuda::q8_act(scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, cols) + 3) / 4),
                                  rows, cols);
            if (cuda::rmsnorm(at(a.in[0]), ld(0), at(a.out), a.out.ld, rows, cols,
                              node.op == Op::RmsNorm ? cols : m.head_dim, (const float*)weight(m.weight).p, m.eps, q8,
                              stream_))
                prequant_ = Prequant{at(a.out), a.out.ld, cols, rows, q8.q};
            return;
        }
        case Op::MatMul:
            project(node, a, {proj(m.weight, m.bias, cols, 0)}, false);
            return;
        case Op::FusedQKV:
            project(node, a, qkv_parts(), false);
            return;
        case Op::FusedQkvRope: {  // decode: the matvec's end rotates and stores; else the separate kernel after it
            const int32_t* pos = (const int32_t*)at(a.in[1]);
            const int32_t* pool_rows = a.in.size() > 2 ? (const int32_t*)at(a.in[2]) : nullptr;  // a batch step's
            cuda::QkvRopeEpilogue e;
            e.pos = pos;
            e.rows = pool_rows;
            e.head_dim = m.head_dim;
            e.rope_dim = m.rope_dim;
            e.n_ctx = m.n_ctx;
            e.ring = m.kv_ring;
            e.base = m.rope_base;
            e.scale = m.rope_scale;
            e.neox = m.rope_neox;
            e.kv_type = m.kv_type;
            e.K = raw(a.kv_k);
            e.V = raw(a.kv_v);
            e.err = err_dev_;
            if (project(node, a, qkv_parts(), false, &e))
                return;
            if (rows == 1 && qkv_rope_mode() == QkvRope::Epilogue)
                throw MinferError(strfmt("CUDA '%s': cuda.qkv_rope=epilogue, but this projection's matvec cannot "
                                         "rotate and store (%d rows, %s cache, head_dim %d, rope_dim %d)",
                                         node.name.c_str(), rows, type_traits(m.kv_type).name, m.head_dim, m.rope_dim));
            float* y = at(a.out);
            const int64_t ly = a.out.ld;
            cuda::RopeStoreShape sh{rows, m.q_cols, m.n_head_kv * m.head_dim, m.head_dim, m.rope_dim, m.rope_base,
                                    m.rope_scale, m.rope_neox, m.kv_type, m.n_ctx, m.kv_ring};
            return cuda::rope_kv_store(sh, y, ly, y + m.q_cols, ly, y + m.q_cols + m.k_cols, ly, pos, pool_rows, y, ly,
                                       raw(a.kv_k), raw(a.kv_v), err_dev_, stream_);
        }
        case Op::FusedQkvNorm: {  // the projections, then qwen3's per-head norms of q and k in place
            project(node, a, qkv_parts(), false);
            float* y = at(a.out);
            cuda::rmsnorm(y, a.out.ld, y, a.out.ld, rows, m.q_cols, m.head_dim, (const float*)weight(m.q_norm).p, m.eps,
                          cuda::Q8Act{}, stream_);
            cuda::rmsnorm(y + m.q_cols, a.out.ld, y + m.q_cols, a.out.ld, rows, m.k_cols, m.head_dim,
                          (const float*)weight(m.k_norm).p, m.eps, cuda::Q8Act{}, stream_);
            return;
        }
        case Op::FusedFFN:
            project(node, a, {proj(m.w_gate, "", cols, 0), proj(m.w_up, "", cols, 0)}, true);
            return;
        case Op::Rope:
            return cuda::rope(at(a.in[0]), ld(0), at(a.out), a.out.ld, (const int32_t*)at(a.in[1]), rows, cols,
                              m.head_dim, m.rope_dim, m.rope_base, m.rope_scale, m.rope_neox, stream_);
        case Op::KvStore:
            return cuda::kv_store(m.kv_type, at(a.in[0]), ld(0), at(a.in[1]), ld(1), (const int32_t*)at(a.in[2]), rows,
                                  m.n_head_kv * m.head_dim, m.n_ctx, m.kv_ring, raw(a.kv_k), raw(a.kv_v), err_dev_,
                                  stream_);
        case Op::AddRmsNorm: {
            const int n = cols / 2;
            // whether the norm feeds a q/k/v projection, and whether its q rows are Q4_K (the pipe kernel's:
            // the launch rule of add_norm_kernel)
            const bool feeds_qkv = !m.feeds_q.empty();
            auto wq = feeds_qkv ? weights_.find(m.feeds_q) : weights_.end();
            const bool q4k = wq != weights_.end() && wq->second.type == GGML_TYPE_Q4_K;
            // A batch step's norm is also written in gemm_mma's layout where the projection after it takes that
            // product; decode's, as the next projection's 8-bit activations.
            cuda::MmaAct xb = mma_act_for(m.feeds, rows, n);
            cuda::Q8Act q8;
            if (!xb.p && decode_q8_ && rows <= kMatvecMaxRows && n % 64 == 0)
                q8 = cuda::q8_act(scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, n) + 3) / 4),
                                  rows, n);
            if (cuda::add_rmsnorm(at(a.in[0]), ld(0), at(a.in[1]), ld(1), at(a.out), a.out.ld, rows, n,
                                  (const float*)weight(m.weight).p, m.eps, q8, stream_, feeds_qkv, q4k, xb))
                premma_ = Prequant{at(a.out) + n, a.out.ld, n, rows, xb.p};
            if (q8.q) prequant_ = Prequant{at(a.out) + n, a.out.ld, n, rows, q8.q};
            return;
        }
        case Op::RopeKvStore: {
            cuda::RopeStoreShape sh{rows, cols, m.n_head_kv * m.head_dim, m.head_dim, m.rope_dim, m.rope_base,
                                    m.rope_scale, m.rope_neox, m.kv_type, m.n_ctx, m.kv_ring};
            const int32_t* pool_rows = a.in.size() > 4 ? (const int32_t*)at(a.in[4]) : nullptr;  // a batch step's
            return cuda::rope_kv_store(sh, at(a.in[0]), ld(0), at(a.in[1]), ld(1), at(a.in[2]), ld(2),
                                       (const int32_t*)at(a.in[3]), pool_rows, at(a.out), a.out.ld, raw(a.kv_k),
                                       raw(a.kv_v), err_dev_, stream_);
        }
        case Op::Attn: {
            if (m.block_size > 0) {  // a batch step over the paged pool
                const int max_blocks = int(a.in[4].ld);
                AttnShape s{rows, m.n_head, m.n_head_kv, m.head_dim, max_blocks * m.block_size, m.kv_type, m.attn_scale,
                            m.window};
                const size_t need = cuda::attention_paged_scratch_floats(s);
                float* sc = need ? scratch(ascratch_, ascratch_n_, need) : nullptr;
                cuda::KvPages pg{(const int32_t*)at(a.in[3]), (const int32_t*)at(a.in[4]), max_blocks, m.block_size};
                const cuda::MmaAct xb = mma_act_for(m.feeds, rows, cols);  // the O projection's, where it takes gemm_mma
                if (cuda::attention_paged(s, pg, at(a.in[0]), ld(0), (const int32_t*)at(a.in[1]), raw(a.kv_k),
                                          raw(a.kv_v), at(a.out), a.out.ld, sc, err_dev_, stream_, xb))
                    premma_ = Prequant{at(a.out), a.out.ld, cols, rows, xb.p};
                return;
            }
            AttnShape s{rows, m.n_head, m.n_head_kv, m.head_dim, m.n_ctx, m.kv_type, m.attn_scale, m.window, m.kv_ring};
            const size_t need = attention_scratch_floats(s);
            float* sc = need ? scratch(ascratch_, ascratch_n_, need) : nullptr;
            cuda::Q8Act q8;  // decode with a combine step: also the output as the O projection's 8-bit activations
            if (decode_q8_ && rows <= kMatvecMaxRows && cols % 64 == 0 && m.head_dim % 32 == 0 &&
                cuda::attention_splits(s) > 1)
                q8 = cuda::q8_act(scratch(qscratch_, qscratch_n_, (cuda::matvec_q8_scratch_bytes(rows, cols) + 3) / 4),
                                  rows, cols);
            cuda::attention(s, at(a.in[0]), ld(0), (const int32_t*)at(a.in[1]), raw(a.kv_k), raw(a.kv_v), at(a.out),
                            a.out.ld, sc, err_dev_, q8, stream_);
            if (q8.q) prequant_ = Prequant{at(a.out), a.out.ld, cols, rows, q8.q};
            return;
        }
        case Op::Add: case Op::Mul: case Op::SwiGLU: case Op::GeGLU:
            return cuda::elementwise(node.op == Op::Add ? Ew::Add : node.op == Op::Mul ? Ew::Mul
                                     : node.op == Op::SwiGLU ? Ew::SwiGLU : Ew::GeGLU,
                                     at(a.in[0]), ld(0), at(a.in[1]), ld(1), at(a.out), a.out.ld, rows, cols, stream_);
        case Op::Silu: case Op::Gelu: case Op::Scale: case Op::SoftCap:
            return cuda::elementwise(node.op == Op::Silu ? Ew::Silu : node.op == Op::Gelu ? Ew::Gelu
                                     : node.op == Op::Scale ? Ew::Scale : Ew::SoftCap,
                                     at(a.in[0]), ld(0), nullptr, 0, at(a.out), a.out.ld, rows, cols, stream_, m.scale);
        default:
            throw MinferError(strfmt("CUDA backend cannot execute node '%s' (op %s)", node.name.c_str(), op_name(node.op)));
    }
}

}  // namespace minfer::cuda_host
