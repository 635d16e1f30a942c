#include "backends/cpu/matmul.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace minfer {

namespace {

void check_shapes(uint32_t type, int64_t rows, int64_t cols, int64_t n_tok, const DotKernels* kernels) {
    const TypeTraits& t = type_traits(type);
    if (!t.known) throw MinferError(strfmt("matmul: unknown weight type id %u", type));
    if (kernels && !kernels->dot[type])
        throw MinferError(strfmt("matmul: weight type %s has no %s kernel", t.name, isa_name(kernels->isa)));
    if (rows < 0 || n_tok < 0 || cols <= 0)
        throw MinferError(strfmt("matmul: bad shape rows=%lld cols=%lld n_tok=%lld", (long long)rows,
                                 (long long)cols, (long long)n_tok));
    const TypeTraits& a = type_traits(vec_dot_type(type));
    if (cols % t.block_size != 0 || cols % a.block_size != 0)
        throw MinferError(strfmt("matmul: %lld columns is not a multiple of the %s block (%d) / %s block (%d)",
                                 (long long)cols, t.name, t.block_size, a.name, a.block_size));
}

}  // namespace

void matmul_jobs(const MatJob* jobs, int n_jobs, int64_t cols, const float* x, int64_t x_ld, int64_t n_tok,
                 ThreadPool& pool, const DotKernels& kernels) {
    for (int j = 0; j < n_jobs; j++) check_shapes(jobs[j].type, jobs[j].rows, cols, n_tok, &kernels);
    if (n_tok == 0 || n_jobs == 0) return;

    // Activations in each needed dot format, quantized once (f32 is used in place
    // when X is contiguous).
    // f16 block scales come converted to f32 alongside (act_scales), for the rows kernels.
    struct Act { uint32_t type; size_t row_bytes; std::vector<uint8_t> buf; const uint8_t* p; int64_t n_sc; std::vector<float> sc; };
    std::vector<Act> acts;
    std::vector<int> act_of((size_t)(n_jobs));
    for (int j = 0; j < n_jobs; j++) {
        uint32_t at = vec_dot_type(jobs[j].type);
        size_t k = 0;
        while (k < acts.size() && acts[k].type != at) k++;
        if (k == acts.size()) acts.push_back({at, row_size(at, cols), {}, nullptr, act_scale_count(at, cols), {}});
        act_of[size_t(j)] = int(k);
    }
    for (Act& a : acts) {
        if (a.type == GGML_TYPE_F32 && x_ld == cols) {
            a.p = (const uint8_t*)x;
            continue;
        }
        a.buf.resize(a.row_bytes * size_t(n_tok));
        a.sc.resize(size_t(a.n_sc * n_tok));
        uint8_t* dst = a.buf.data();
        float* sc = a.sc.data();
        const size_t rb = a.row_bytes;
        const uint32_t at = a.type;
        const int64_t n_sc = a.n_sc;
        auto quantize_one = [&](int64_t t, int) {
            kernels.quantize(at, x + t * x_ld, dst + size_t(t) * rb, cols);
            if (n_sc) act_scales(at, dst + size_t(t) * rb, cols, sc + t * n_sc);
        };
        if (n_tok > 1) pool.parallel_for(n_tok, quantize_one);
        else quantize_one(0, 0);
        a.p = a.buf.data();
    }

    // rows [r0, r1) of job j for tokens [t0, t1)
    auto block = [&](int j, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        const MatJob& job = jobs[j];
        const Act& a = acts[size_t(act_of[size_t(j)])];
        const size_t w_row = row_size(job.type, cols);
        const vec_dot_fn dot = kernels.dot[job.type];
        const vec_dot_rows_fn rows = kernels.rows[job.type];
        const vec_dot_tile4_fn tile4 = kernels.tile4[job.type];
        const vec_dot_tile8_fn tile8 = kernels.tile8[job.type];
        const uint8_t* wb = (const uint8_t*)job.w;
        int64_t t = t0;
        // eight, four, then two tokens per weight-row pass, then single tokens, where the ISA has the rows kernel;
        // eight weight rows at a time where it has an eight-row tile (two tokens or more), then four where it has
        // a tile kernel (the same bits either way), sixteen tokens where the tile takes them (rows left over
        // take two passes of eight).  The first pass over the task's rows reads them from memory: the tile
        // kernel prefetches the next rows then.
        const bool t16 = tile4 && kernels.tile16[job.type];
        for (int step : {16, 8, 4, 2, 1})
            for (; rows && (step < 16 || t16) && t + step <= t1; t += step) {
                const uint8_t* ap = a.p + size_t(t) * a.row_bytes;
                const float* sp = a.sc.data() + t * a.n_sc;
                float* yt = job.y + t * job.y_ld;
                int64_t r = r0;
                for (; tile8 && step > 1 && r + 8 <= r1; r += 8) {
                    float o[128];
                    tile8(cols, wb + size_t(r) * w_row, w_row, ap, a.row_bytes, sp, size_t(a.n_sc), step, t == t0, o);
                    for (int k = 0; k < step; k++)
                        for (int q = 0; q < 8; q++) yt[k * job.y_ld + r + q] = o[8 * k + q];
                }
                for (; tile4 && r + 4 <= r1; r += 4) {
                    float o[64];
                    tile4(cols, wb + size_t(r) * w_row, w_row, ap, a.row_bytes, sp, size_t(a.n_sc), step, t == t0, o);
                    for (int k = 0; k < step; k++)
                        for (int q = 0; q < 4; q++) yt[k * job.y_ld + r + q] = o[4 * k + q];
                }
                for (; r < r1; r++)
                    for (int h = 0; h < step; h += 8) {  // 16 tokens: two passes of the rows kernel's 8
                        const int n = step < 8 ? step : 8;
                        float o[8];
                        rows(cols, wb + size_t(r) * w_row, ap + size_t(h) * a.row_bytes, a.row_bytes,
                             sp + h * a.n_sc, size_t(a.n_sc), n, o);
                        for (int k = 0; k < n; k++) yt[(h + k) * job.y_ld + r] = o[k];
                    }
            }
        for (; t < t1; t++) {
            const uint8_t* ap = a.p + size_t(t) * a.row_bytes;
            float* yt = job.y + t * job.y_ld;
            for (int64_t r = r0; r < r1; r++) yt[r] = dot(cols, wb + size_t(r) * w_row, ap);
        }
    };
    if (n_tok <= 16) {
        // Decode: the jobs' rows in groups of 16, one forward run per thread, the slower run's tail taken from
        // its back by the thread done first, 4 groups (64 rows, 32-80 KB) a claim (parallel_ranges).
        std::vector<int64_t> first_group(size_t(n_jobs) + 1, 0);
        for (int j = 0; j < n_jobs; j++) first_group[size_t(j) + 1] = first_group[size_t(j)] + (jobs[j].rows + 15) / 16;
        pool.parallel_ranges(first_group[size_t(n_jobs)], 4, [&](int64_t g0, int64_t g1, int) {
            for (int j = 0; j < n_jobs && g0 < g1; j++) {
                if (g0 >= first_group[size_t(j) + 1]) continue;
                const int64_t e = g1 < first_group[size_t(j) + 1] ? g1 : first_group[size_t(j) + 1];
                const int64_t r0 = (g0 - first_group[size_t(j)]) * 16, r1 = (e - first_group[size_t(j)]) * 16;
                block(j, r0, r1 < jobs[j].rows ? r1 : jobs[j].rows, 0, n_tok);
                g0 = e;
            }
        });
        return;
    }
    // Prefill: tiles of 16 weight rows x 64 tokens, numbered job by job.  The rows come from memory once per
    // token tile and from L1/L2 for the tile's other tokens, while 64 tokens' activations stay in L2.
    constexpr int64_t kTok = 64, kRows = 16;
    const int64_t tok_tiles = (n_tok + kTok - 1) / kTok;
    std::vector<int64_t> first_tile(size_t(n_jobs) + 1, 0);
    for (int j = 0; j < n_jobs; j++)
        first_tile[size_t(j) + 1] = first_tile[size_t(j)] + (jobs[j].rows + kRows - 1) / kRows * tok_tiles;
    pool.parallel_for(first_tile[size_t(n_jobs)], [&](int64_t task, int) {
        int j = 0;
        while (task >= first_tile[size_t(j) + 1]) j++;
        const int64_t local = task - first_tile[size_t(j)];
        const int64_t row_tiles = (jobs[j].rows + kRows - 1) / kRows;
        const int64_t r0 = (local % row_tiles) * kRows, t0 = (local / row_tiles) * kTok;
        block(j, r0, r0 + kRows < jobs[j].rows ? r0 + kRows : jobs[j].rows, t0, t0 + kTok < n_tok ? t0 + kTok : n_tok);
    });
}

void matmul(const void* w, uint32_t type, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
            float* y, ThreadPool& pool, const DotKernels& kernels) {
    MatJob job{w, type, rows, y, rows};
    matmul_jobs(&job, 1, cols, x, cols, n_tok, pool, kernels);
}

void matmul_ref(const void* w, uint32_t type, int64_t rows, int64_t cols, const float* x, int64_t n_tok,
                float* y) {
    check_shapes(type, rows, cols, n_tok, nullptr);
    const uint32_t act_type = vec_dot_type(type);
    const size_t w_row = row_size(type, cols);
    std::vector<uint8_t> aq(row_size(act_type, cols));
    std::vector<float> a((size_t)cols), wr((size_t)cols);
    for (int64_t t = 0; t < n_tok; t++) {
        quantize_row_act(act_type, x + t * cols, aq.data(), cols);
        dequantize_row(act_type, aq.data(), a.data(), cols);
        for (int64_t r = 0; r < rows; r++) {
            dequantize_row(type, (const uint8_t*)w + size_t(r) * w_row, wr.data(), cols);
            double s = 0.0;
            for (int64_t i = 0; i < cols; i++) s += double(wr[size_t(i)]) * double(a[size_t(i)]);
            y[t * rows + r] = float(s);
        }
    }
}

}  // namespace minfer
