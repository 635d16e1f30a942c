// The kernels that walk a weight row's chunks on 8-bit activations: the warp kernel (a warp a row, any rows),
// the block kernel (8 rows a block sharing x, optionally staged in shared memory or spread over whole waves),
// the pipe kernel (x in shared memory, a lane's chunks loaded ahead; its RoPE + KV-store epilogue) and the
// stream kernel (a GPU-sized grid walking many short rows).  matvec_q8.cu picks one per launch.
// Reference: tests/test_cuda_matvec.py (each kernel against float64 and against each other, bit for bit).
#pragma once
// Included once, by matvec_q8.cu, inside its anonymous namespace (one translation unit, as when it was one file).

constexpr int kR = kMatvecMaxRows;

// One warp per block of 32 values; blockIdx.y is the row.
__global__ void quantize_x_kernel(const float* __restrict__ x, int64_t ldx, int64_t K, int8_t* __restrict__ q,
                                  float2* __restrict__ ds) {
    pdl_start();
    const int lane = threadIdx.x & 31;
    const int64_t b = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5), r = blockIdx.y;
    if (b >= K / 32) return;  // whole warps
    quantize_lane(x[r * ldx + b * 32 + lane], q + r * K + b * 32 + lane, ds + r * (K / 32) + b);
}

// A lane's Q6_K chunks c, c + step, ... (step % 32 == 0: each keeps its place in the super-block, as Stream's)
// walked from one block pointer with the lane's offsets: the Q6_K rows of the kernels built for several types at
// the 40-register cap -- the pipe kernel (the V rows of some layers' QKV) and the warp kernel's mixed-type build
// -- where chunk_dot's per-chunk addresses spilled, the sums of the other types' loops among them (the pipe
// kernel's one-chunk-ahead build spilled 28 bytes).  The same sums
// in the same order as lane_chunks and row_dots.
__device__ __forceinline__ float q6k_lane_walk(const uint8_t* __restrict__ row, const XQ& x, int c, int step) {
    using S = Stream<GGML_TYPE_Q6_K>;
    const S::Lane L = S::lane(c);
    const int chunks = int(x.K / 64);
    const uint8_t* b = row + int64_t(c / 4) * S::kBytes;
    float acc = 0.0f;
#pragma unroll 1
    for (; c < chunks; c += step, b += (step / 4) * S::kBytes) acc += S::dot(S::load(b, L), c, L, x);
    return acc;
}

// NR: the activation rows the code is built for (1: decode's usual case, with a fraction of the registers of
// kR, so more warps fit per SM); n_rows <= NR of them are used.
template <int T, int NR>
__device__ __forceinline__ void row_dots(const uint8_t* __restrict__ row, const XQ& x, int n_rows, int lane,
                                         float (&acc)[NR]) {
    const int chunks = int(x.K / chunk_values<T>());
    for (int c = lane; c < chunks; c += 32)
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r < n_rows) acc[r] += chunk_dot<T>(row, c, x.q + r * x.K, x.ds + r * (x.K / 32));
}

template <int NR>
__device__ __forceinline__ void row_dots_any(uint32_t type, const uint8_t* row, const XQ& x, int n_rows, int lane,
                                             float (&acc)[NR]) {
    switch (type) {
        case GGML_TYPE_Q4_0: return row_dots<GGML_TYPE_Q4_0, NR>(row, x, n_rows, lane, acc);
        case GGML_TYPE_Q5_0: return row_dots<GGML_TYPE_Q5_0, NR>(row, x, n_rows, lane, acc);
        case GGML_TYPE_Q8_0: return row_dots<GGML_TYPE_Q8_0, NR>(row, x, n_rows, lane, acc);
        case GGML_TYPE_Q4_K: return row_dots<GGML_TYPE_Q4_K, NR>(row, x, n_rows, lane, acc);
        case GGML_TYPE_Q6_K:
            if constexpr (NR == 1) acc[0] += q6k_lane_walk(row, x, lane, 32);  // fewer registers (above)
            else row_dots<GGML_TYPE_Q6_K, NR>(row, x, n_rows, lane, acc);
            return;
        default: return;
    }
}

constexpr int kAnyType = -1;  // a kernel built with every weight type behind a switch (parts of mixed types)

template <int T, int NR>
__device__ __forceinline__ void row_dots_t(uint32_t type, const uint8_t* row, const XQ& x, int n_rows, int lane,
                                           float (&acc)[NR]) {
    if constexpr (T == kAnyType) row_dots_any<NR>(type, row, x, n_rows, lane, acc);
    else row_dots<T, NR>(row, x, n_rows, lane, acc);
}

// One warp per weight row (gate and up rows together with swiglu), kMatvecWarps rows per block.  Built for
// one activation row with at most 40 registers, so that six blocks (48 warps) fit per SM: occupancy is what
// this latency-bound loop pays for.  Built per weight type T for one row: the build with every type behind a
// switch spills 80 bytes at 40 registers;
// kAnyType for several activation rows, or parts of mixed types.
template <int T, int NR>
__global__ void __launch_bounds__(32 * kMatvecWarps, NR == 1 ? 6 : 4) matvec_q8_kernel(MatvecArgs a, XQ x) {
    pdl_start();
    const int lane = threadIdx.x & 31;
    const WarpRow row = warp_row(a, int64_t(blockIdx.x) * kMatvecWarps + (threadIdx.x >> 5));
    if (!row.live) return;  // no block-wide barriers below
    const MatvecPart& A = a.part[row.p];
    float acc[NR], acc2[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = acc2[r] = 0.0f;
    row_dots_t<T, NR>(A.type, A.W + row.o * A.rb, x, a.n_rows, lane, acc);
    if (a.swiglu) row_dots_t<T, NR>(a.part[1].type, a.part[1].W + row.o * a.part[1].rb, x, a.n_rows, lane, acc2);
#pragma unroll
    for (int r = 0; r < NR; r++) {
        acc[r] = warp_sum(acc[r]);
        acc2[r] = warp_sum(acc2[r]);
    }
    if (lane == 0) store_warp_row(a, row, acc, acc2);
}

// Decode's usual case, one activation row, laid out so that x is shared: a block computes 8 weight rows (with
// swiglu: 4 gate rows and the same outputs' 4 up rows) and its 8 warps split K between them.  In a warp, four
// lanes take four consecutive chunks of one row (a Q4_K/Q6_K super-block, four Q8_0 blocks), the warp's 8
// rows side by side, so a warp's x load is 4 distinct chunks broadcast to 8 rows; one warp per row made every
// lane load its own 64 bytes of x, and those L1 wavefronts, not DRAM, capped it.  Same 40
// registers.
// The kernel is built per weight type (T; kAnyType switches per row, for launches whose parts differ in type):
// the switching build ran Q6_K a quarter slower than its own build.  U = 2 unrolls a lane's loop
// by two (two chunks' loads in flight, 64 registers, four blocks per SM): for long rows, where a lane walks
// >= 4 chunks (rows of ~3584 values lost with it), and Q6_K rows where a lane
// has a second chunk (q6k_unrolled).  U = 1 keeps Q6_K's loop rolled (unrolled by the compiler it spills at 40
// registers); U = 0 leaves the compiler's choice.
constexpr int kBlockRows = 8, kLanesPerRow = 4;

template <int T, int U, int Q6 = kQ6Words>
__device__ __forceinline__ float lane_chunks(const uint8_t* __restrict__ row, const XQ& x, int c, int step) {
    float acc = 0.0f;
    const int chunks = int(x.K / chunk_values<T>());
    if constexpr (U == 0) {  // the compiler's choice
        for (; c < chunks; c += step) acc += chunk_dot<T, Q6>(row, c, x.q, x.ds);
    } else {
#pragma unroll U
        for (; c < chunks; c += step) acc += chunk_dot<T, Q6>(row, c, x.q, x.ds);
    }
    return acc;
}

__device__ __forceinline__ float lane_chunks_any(uint32_t type, const uint8_t* row, const XQ& x, int c, int step) {
    switch (type) {
        case GGML_TYPE_Q4_0: return lane_chunks<GGML_TYPE_Q4_0, 0>(row, x, c, step);
        case GGML_TYPE_Q5_0: return lane_chunks<GGML_TYPE_Q5_0, 0>(row, x, c, step);
        case GGML_TYPE_Q8_0: return lane_chunks<GGML_TYPE_Q8_0, 0>(row, x, c, step);
        case GGML_TYPE_Q4_K: return lane_chunks<GGML_TYPE_Q4_K, 0>(row, x, c, step);
        case GGML_TYPE_Q6_K: return lane_chunks<GGML_TYPE_Q6_K, 1>(row, x, c, step);
        default: return 0.0f;
    }
}

// The block's weight rows staged in shared memory (block_stage): every thread issues cp.async copies of 16
// bytes for its share of them, so all the block's bytes are in flight at once -- one DRAM round trip for
// the block, where a lane walking its chunks waited one round trip per chunk -- and the copies cost no
// registers.  The rows: 8 consecutive rows of one part, or with swiglu 4 gate rows then the same 4 up
// rows.  A block whose rows are not all there (the last one, or one straddling two parts) is not staged
// and reads global memory as before.  Every thread calls it; the result is uniform over the block.
enum : int { kStageOff = 0, kStageBeforeWait = 2 };

__device__ __forceinline__ void cp_async16(uint8_t* smem, const void* gmem) {
    const uint32_t d = uint32_t(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem) : "memory");
}

__device__ __forceinline__ bool stage_block_rows(const MatvecArgs& a, uint8_t* smem) {
    constexpr int half = kBlockRows / 2;
    int64_t o = int64_t(blockIdx.x) * (a.swiglu ? half : kBlockRows);
    int p = 0;
    if (a.swiglu) {
        if (o + half > a.part[0].n_out) return false;
    } else {
        while (p < a.n_parts && o >= a.part[p].n_out) o -= a.part[p++].n_out;
        if (p >= a.n_parts || o + kBlockRows > a.part[p].n_out) return false;
        // a part whose first row is not a multiple of 4 blocks into the launch puts o off the 16-byte grid
        if ((o * a.part[p].rb) % 16) return false;
    }
    const int regions = a.swiglu ? 2 : 1, rows = a.swiglu ? half : kBlockRows;
    int64_t off = 0;
    for (int g = 0; g < regions; g++) {
        const MatvecPart& A = a.part[a.swiglu ? g : p];
        const uint8_t* src = A.W + o * A.rb;  // 16-byte aligned: block_stage checked W and rb
        const int n16 = int(rows * A.rb / 16);
        for (int i = threadIdx.x; i < n16; i += blockDim.x) cp_async16(smem + off + 16 * i, src + 16 * i);
        off += rows * A.rb;
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    return true;
}

// Row i of a block's 8 weight rows (with swiglu, gate/up pair i % 4 of its 4): what the block kernel and the pipe
// kernel share, with the end both take -- each row's partial sums of the 8 warps (sums[warp][row], written and
// synchronized by the caller) added in warp order by thread t < the block's rows, and stored.
// g: the block's group of rows (its blockIdx.x, or the group a stream kernel's block is at).  SPREAD: block g
// takes rows (with swiglu gate/up pairs) g q + min(g, r) .. of the launch's n = q gridDim.x + r, q + (g < r) of
// them (MatvecArgs::spread_q, spread_r; spread_grid).
template <bool SPREAD = false>
__device__ __forceinline__ WarpRow block_row(const MatvecArgs& a, int i, int64_t g = blockIdx.x) {
    constexpr int half = kBlockRows / 2;
    if constexpr (SPREAD) {
        const int j = a.swiglu ? i % half : i;
        const int64_t first = g * a.spread_q + min(g, a.spread_r);
        WarpRow w = warp_row(a, first + j);
        w.live = w.live && j < a.spread_q + (g < a.spread_r);
        return w;
    }
    return a.swiglu ? warp_row(a, g * half + i % half) : warp_row(a, g * kBlockRows + i);
}

template <bool SPREAD = false>
__device__ __forceinline__ void store_block_rows(const MatvecArgs& a, const float (&sums)[kMatvecWarps][kBlockRows],
                                                 int64_t g = blockIdx.x) {
    const int t = threadIdx.x;
    if (t >= (a.swiglu ? kBlockRows / 2 : kBlockRows)) return;
    const WarpRow out = block_row<SPREAD>(a, t, g);
    if (!out.live) return;
    float s = 0.0f, s2 = 0.0f;  // the row's sum over the warps (with swiglu s2: its up row's)
#pragma unroll
    for (int w = 0; w < kMatvecWarps; w++) {
        s += sums[w][t];
        if (a.swiglu) s2 += sums[w][t + kBlockRows / 2];
    }
    store_warp_row(a, out, &s, &s2);
}

// SPREAD: rows dealt as block_row<true> says (never staged: stage is kStageOff).
template <int T, int U, bool SPREAD = false>
__global__ void __launch_bounds__(32 * kMatvecWarps, U == 2 ? 4 : 6) matvec_q8_block_kernel(MatvecArgs a, XQ x,
                                                                                           int stage) {
    extern __shared__ __align__(16) uint8_t wsm[];  // the staged rows (block_stage sizes it)
    __shared__ float sums[kMatvecWarps][kBlockRows];
    bool staged = false;
    // the weights are no earlier kernel's output: their copy may start before the wait and overlap it
    if (stage == kStageBeforeWait) staged = stage_block_rows(a, wsm);
    pdl_start();
    if (staged) {  // uniform over the block
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads();
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = lane % kLanesPerRow, r = lane / kLanesPerRow;
    const WarpRow row = block_row<SPREAD>(a, r);
    float acc = 0.0f;
    if (row.live) {
        const MatvecPart& A = a.part[a.swiglu ? r / (kBlockRows / 2) : row.p];
        const int64_t slot = a.swiglu && r >= kBlockRows / 2
                                 ? (kBlockRows / 2) * a.part[0].rb + (r - kBlockRows / 2) * A.rb
                                 : r * A.rb;
        const uint8_t* w = staged ? wsm + slot : A.W + row.o * A.rb;
        const int c = k + kLanesPerRow * warp, step = kLanesPerRow * kMatvecWarps;
        if constexpr (T == kAnyType) acc = lane_chunks_any(A.type, w, x, c, step);
        else acc = lane_chunks<T, U, U == 2 ? kQ6WideDp4a : kQ6Wide>(w, x, c, step);
    }
#pragma unroll
    for (int o = kLanesPerRow / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    const int t = threadIdx.x;  // (lane, warp, r re-derived from it: fewer registers live across the loop)
    if (t % kLanesPerRow == 0) sums[t >> 5][(t & 31) / kLanesPerRow] = acc;
    __syncthreads();
    store_block_rows<SPREAD>(a, sums);
}

// Several activation rows (2..NR: a batch step's few tokens) in the block kernel's layout -- 8 weight rows a
// block, four lanes a row in each warp, chunks dealt round-robin, x read through L1 -- with each chunk loaded
// once and dotted with every activation row, the next chunk in flight while a lane computes: the weights are
// streamed once for all the rows, as the one-row kernels stream them for one.  Each row's sum takes the block
// kernel's chunks, lanes and warps in its order: row r's bits are those of a one-row launch on x row r.
// T: Q4_K or Q6_K rows (kAnyType: a launch whose parts differ, switched per lane).
template <int T, int NR>
__device__ __forceinline__ void rows_lane_chunks(const uint8_t* __restrict__ row, const XQ& x, int n_rows, int c0,
                                                 float (&acc)[NR]) {
    using S = Stream<T>;
    constexpr int step = kLanesPerRow * kMatvecWarps;
    static_assert(step % 32 == 0, "a lane's chunks must keep their place in the super-block (Stream)");
    const int chunks = int(x.K / 64);
    const typename S::Lane L = S::lane(c0);
    const uint8_t* b = row + int64_t(c0 / 4) * S::kBytes;
    typename S::Chunk cur{};
    if (c0 < chunks) cur = S::load(b, L);
    for (int c = c0; c < chunks; c += step) {
        b += (step / 4) * S::kBytes;
        typename S::Chunk nxt{};
        if (c + step < chunks) nxt = S::load(b, L);
#pragma unroll
        for (int i = 0; i < NR; i++)
            if (i < n_rows) acc[i] += S::dot(cur, c, L, XQ{x.q + i * x.K, x.ds + i * (x.K / 32), x.K});
        cur = nxt;
    }
}

template <int T, int NR>
__global__ void __launch_bounds__(32 * kMatvecWarps, 4) matvec_q8_rows_kernel(MatvecArgs a, XQ x) {
    __shared__ float sums[NR][kMatvecWarps][kBlockRows];
    pdl_start();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = lane % kLanesPerRow, r = lane / kLanesPerRow;
    const WarpRow row = block_row(a, r);
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;
    if (row.live) {
        const MatvecPart& A = a.part[a.swiglu ? r / (kBlockRows / 2) : row.p];
        const uint8_t* w = A.W + row.o * A.rb;
        const int c0 = k + kLanesPerRow * warp;
        const bool q4k = T == kAnyType ? A.type == GGML_TYPE_Q4_K : T == GGML_TYPE_Q4_K;
        if (q4k) rows_lane_chunks<GGML_TYPE_Q4_K, NR>(w, x, a.n_rows, c0, acc);
        else rows_lane_chunks<GGML_TYPE_Q6_K, NR>(w, x, a.n_rows, c0, acc);
    }
#pragma unroll
    for (int i = 0; i < NR; i++) {
#pragma unroll
        for (int o = kLanesPerRow / 2; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
        if (k == 0) sums[i][warp][r] = acc[i];
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t >= (a.swiglu ? kBlockRows / 2 : kBlockRows)) return;
    const WarpRow out = block_row(a, t);
    if (!out.live) return;
    float s[NR], s2[NR];  // the row's sums over the warps in warp order (with swiglu s2: its up row's)
#pragma unroll
    for (int i = 0; i < NR; i++) {
        s[i] = s2[i] = 0.0f;
#pragma unroll
        for (int v = 0; v < kMatvecWarps; v++) {
            s[i] += sums[i][v][t];
            if (a.swiglu) s2[i] += sums[i][v][t + kBlockRows / 2];
        }
    }
    store_warp_row(a, out, s, s2);
}

// FusedQkvRope's launch (parts q, k, v): a block's 8 rows are 4 rotation pairs, so that its end can rotate them.
// NeoX pairs dims j and j + head_dim / 2 of a head: the block takes rows j..j+3 and j+hd/2..j+hd/2+3 (row i's
// partner is i ^ 4); the original layout pairs dims 2j and 2j + 1: 8 consecutive rows (partner i ^ 1).
__device__ __forceinline__ int64_t rope_block_row(const QkvRopeEpilogue& e, int i) {
    if (!e.neox) return int64_t(blockIdx.x) * kBlockRows + i;
    const int hd2 = e.head_dim / 2;
    const int64_t g = int64_t(blockIdx.x) * 4 + (i & 3);
    return g / hd2 * e.head_dim + g % hd2 + (i >> 2) * hd2;
}

// The angle of row i's pair at position p (rope_angle's arguments, as rope_kv_store_kernel computes them).
__device__ __forceinline__ double2 rope_row_angle(const QkvRopeEpilogue& e, int64_t o, int p) {
    const int d = int(o % e.head_dim), j = e.neox ? d % (e.head_dim / 2) : d / 2;
    double cs = 1.0, sn = 0.0;
    rope_angle(p, j, e.rope_dim, e.base, e.scale, &cs, &sn);
    return make_double2(cs, sn);
}

// The end of a FusedQkvRope launch: each row's result (the warps' partial sums in warp order, plus the bias, as
// store_block_rows) is written to y unrotated; then q rows are rotated in y, k rows rotated into the cache and v
// rows copied into it at position p's row (a batch step's: at its pool row, *rows) -- the arithmetic of
// rope_kv_store_kernel on the same values, so the same bits.
__device__ __forceinline__ void store_rope_rows(const MatvecArgs& a, const float (&sums)[kMatvecWarps][kBlockRows],
                                                const double2 (&ang)[kBlockRows], int p, float (&vals)[kBlockRows]) {
    const QkvRopeEpilogue& e = a.rope;
    const int t = threadIdx.x;
    WarpRow out{0, 0, false};
    if (t < kBlockRows) {
        out = warp_row(a, rope_block_row(e, t));
        const MatvecPart& A = a.part[out.p];
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kMatvecWarps; w++) s += sums[w][t];
        s = s + (A.bias ? A.bias[out.o] : 0.0f);
        vals[t] = s;
        a.y[A.y_col + out.o] = s;
    }
    __syncthreads();
    if (t >= kBlockRows || !out.live) return;
    const int at = e.rows ? *e.rows : p;  // (read here, not held in a register through the products)
    if (p < 0 || at < 0 || at >= e.n_ctx) {  // nothing stored
        if (blockIdx.x == 0 && t == 0) atomicOr(e.err, kBadPosition);
        return;
    }
    float r = vals[t];
    if (out.p < 2) {
        const int partner = e.neox ? t ^ 4 : t ^ 1;
        const bool lo = e.neox ? t < 4 : (t & 1) == 0;
        const double x0 = lo ? vals[t] : vals[partner], x1 = lo ? vals[partner] : vals[t];
        r = lo ? rope_lo(x0, x1, ang[t].x, ang[t].y) : rope_hi(x0, x1, ang[t].x, ang[t].y);
    }
    if (out.p == 0) {
        a.y[out.o] = r;
        return;
    }
    const int64_t i = (e.rows ? int64_t(at) : kv_cache_row(p, e.ring)) * a.part[1].n_out + out.o;
    void* cache = out.p == 1 ? e.K : e.V;
    if (e.kv_type == GGML_TYPE_F16) ((__half*)cache)[i] = __float2half_rn(r);
    else ((float*)cache)[i] = r;
}

// The block kernel's layout for Q4_K rows with x in shared memory and each lane's weights loaded one chunk
// ahead into registers.  Under ncu the block kernel kept its schedulers issuing half the cycles and stalled
// mostly on long scoreboards: a lane loaded a chunk, waited a DRAM round trip, then spent ~100 instructions
// on it before it asked for the next.  Here a lane asks for chunk i + 1 before it
// computes chunk i, and its first chunk before the PDL wait (the weights are no kernel's output: those
// loads overlap the kernel before).  x comes from shared memory, copied once a block after the wait, so its
// 20 registers a chunk are not held across the loads.  Lane mapping: k = lane / 8 (the chunk of four), r =
// lane % 8 (the row), so the eight lanes of a shared-memory phase read one address.  Each lane adds the same
// chunks in the same order as the block kernel, and the four lanes of a row and the warps are summed in the
// same order: the same bits.  AHEAD = 2 loads two chunks ahead (both before the wait), at 64 registers (4 blocks
// an SM, not 6): for one-wave launches whose lanes walk more than two chunks (e.g. K = 4864).
// ROPE: FusedQkvRope's launch (rope_block_row's rows, store_rope_rows' end); the angles are computed before the
// wait (the position is the step's input: no kernel of the step writes it).
// AHEAD = kWholeRow: for rows of 33-64 chunks (2048 < K <= 4096), where a lane has at most two, both are loaded
// before the wait and no register holds a third: 48 registers, 5 blocks an SM.
constexpr int kWholeRow = 3;

template <int AHEAD, bool ROPE>
__global__ void __launch_bounds__(32 * kMatvecWarps, AHEAD == 1 ? 6 : AHEAD == 2 ? 4 : 5)
    matvec_q4k_pipe_kernel(MatvecArgs a, XQ x) {
    extern __shared__ __align__(16) uint8_t xsm[];  // x.q (K bytes), then x.ds (K / 32 float2)
    __shared__ float sums[kMatvecWarps][kBlockRows];
    constexpr int half = kBlockRows / 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = lane / 8, r = lane % 8;
    const WarpRow row = ROPE ? warp_row(a, rope_block_row(a.rope, r)) : block_row(a, r);
    __shared__ double2 ang[ROPE ? kBlockRows : 1];
    __shared__ float vals[ROPE ? kBlockRows : 1];
    int pos = 0;
    if constexpr (ROPE) {
        pos = *a.rope.pos;
        if (threadIdx.x < kBlockRows && pos >= 0)  // (a position past the cache stores nothing: store_rope_rows)
            ang[threadIdx.x] = rope_row_angle(a.rope, rope_block_row(a.rope, threadIdx.x), pos);
    }
    const int chunks = int(x.K / 64), step = kLanesPerRow * kMatvecWarps;
    int c = k + kLanesPerRow * warp;
    const uint8_t* w = nullptr;
    bool q4k = false;  // else a Q6_K part (Q6_K V rows in a Q4_K QKV): walked as the block kernel does
    Q4kChunk cur{}, nxt{};
    if (row.live) {
        const MatvecPart& A = a.part[a.swiglu ? r / half : row.p];
        w = A.W + row.o * A.rb;
        q4k = A.type == GGML_TYPE_Q4_K;
        if (q4k && c < chunks) cur = q4k_load(w, c);
        if (AHEAD >= 2 && q4k && c + step < chunks) nxt = q4k_load(w, c + step);
    }
    pdl_start();
    uint8_t* dsm = xsm + x.K;  // K % 64 == 0: 16-byte aligned
    for (int i = threadIdx.x; i < int(x.K / 16); i += blockDim.x) ((uint4*)xsm)[i] = ((const uint4*)x.q)[i];
    for (int i = threadIdx.x; i < int(x.K / 64); i += blockDim.x) ((uint4*)dsm)[i] = ((const uint4*)x.ds)[i];
    __syncthreads();
    float acc = 0.0f;
    if (row.live && !q4k) acc = q6k_lane_walk(w, XQ{(const int8_t*)xsm, (const float2*)dsm, x.K}, c, step);
    else if (row.live && AHEAD == kWholeRow) {  // the loop's two steps, in its order (the same bits)
        if (c < chunks) acc += q4k_dot(cur, c, (const int8_t*)xsm, (const float2*)dsm);
        if (c + step < chunks) acc += q4k_dot(nxt, c + step, (const int8_t*)xsm, (const float2*)dsm);
    } else if (row.live)
        for (; c < chunks; c += step) {
            Q4kChunk nn{};
            if (c + AHEAD * step < chunks) nn = q4k_load(w, c + AHEAD * step);
            acc += q4k_dot(cur, c, (const int8_t*)xsm, (const float2*)dsm);
            if (AHEAD == 2) cur = nxt, nxt = nn;
            else cur = nn;
        }
    acc += __shfl_xor_sync(0xffffffffu, acc, 16);  // lanes k ^ 2, then k ^ 1: the block kernel's order
    acc += __shfl_xor_sync(0xffffffffu, acc, 8);
    if (k == 0) sums[warp][r] = acc;
    __syncthreads();
    if constexpr (ROPE) store_rope_rows(a, sums, ang, pos, vals);
    else store_block_rows(a, sums);
}

// The block kernel's layout (8 rows a block, four lanes a row in each warp, chunks dealt round-robin, x read
// through L1) with a lane's chunks loaded as a stream, AHEAD chunks ahead of the one it computes, so that its
// loads are in flight while it computes.  The block walks groups of 8 rows g = blockIdx.x, + gridDim.x, ..., and
// the stream runs on across them: with a grid sized to the GPU, a vocabulary's ~19000 groups are one wave of
// blocks that keep their next group's chunks in flight, where the block kernel runs ~36 waves of blocks that each
// start with a round trip.  The first AHEAD chunks are asked for before the PDL wait (weights: no kernel's output).
// Each lane adds the same chunks in the same order as the block kernel, and the lanes and warps are summed in its
// order: the same bits.  One part, Q4_K or Q6_K, one activation row, no swiglu; where the rule gives it launches,
// and why only those: stream_ahead.
template <int T, int AHEAD>
__global__ void __launch_bounds__(32 * kMatvecWarps, 4) matvec_q8_stream_kernel(MatvecArgs a, XQ x) {
    using S = Stream<T>;
    using Chunk = typename S::Chunk;
    constexpr int step = kLanesPerRow * kMatvecWarps;
    static_assert(step % 32 == 0, "a lane's chunks must keep their place in the super-block (Stream)");
    __shared__ float sums[kMatvecWarps][kBlockRows];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = lane % kLanesPerRow, r = lane / kLanesPerRow;
    const MatvecPart& A = a.part[0];
    const int chunks = int(x.K / 64), c0 = k + kLanesPerRow * warp;
    const typename S::Lane L = S::lane(c0);
    const int64_t groups = (A.n_out + kBlockRows - 1) / kBlockRows;
    // the load cursor, AHEAD chunks before the compute: chunk lc of this lane's row in group lg, whose super-block
    // is at lb (null past the last row)
    int64_t lg = blockIdx.x;
    int lc = c0;
    auto first_block = [&](int64_t g) -> const uint8_t* {
        const int64_t o = g * kBlockRows + r;
        return g < groups && o < A.n_out ? A.W + o * A.rb + (c0 / 4) * S::kBytes : nullptr;
    };
    const uint8_t* lb = first_block(lg);
    auto fetch = [&](Chunk& dst) {
        if (lb && lc < chunks) dst = S::load(lb, L);
        lc += step;
        if (lb) lb += (step / 4) * S::kBytes;  // (null stays null: past the last row)
        if (lc >= chunks) lc = c0, lg += gridDim.x, lb = first_block(lg);
    };
    Chunk cur, nx1;  // a chunk is computed only where it was loaded (the two walks take the same steps)
    fetch(cur);
    if constexpr (AHEAD == 2) fetch(nx1);
    pdl_start();
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {  // uniform over the block
        const bool live = g * kBlockRows + r < A.n_out;
        float acc = 0.0f;
        for (int c = c0; c < chunks; c += step) {
            Chunk nn;
            if constexpr (AHEAD == 2) nn = Chunk{};  // (left undefined, the two-ahead build spills 40 bytes)
            fetch(nn);
            if (live) acc += S::dot(cur, c, L, x);
            if constexpr (AHEAD == 2) cur = nx1, nx1 = nn;
            else cur = nn;
        }
#pragma unroll
        for (int o = kLanesPerRow / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (k == 0) sums[warp][r] = acc;
        __syncthreads();
        store_block_rows(a, sums, g);
        __syncthreads();  // sums is rewritten by the next group
    }
}
