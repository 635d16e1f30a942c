"""The CUDA matmul kernels (rung 1 of the correctness ladder): every path -- the f32 matvec, the
8-bit-activation matvec kernels (warp, block, pipe, stream; staged, spread) and the prefill GEMM -- against
float64 numpy on dequantized weights at real model shapes, with the rounding bound of the path, and the
kernels that must agree bit for bit against each other.  Tests reach paths the dispatch rules would not
take through the kernel-choice hook (the `force` fixture).  Needs an NVIDIA GPU; skips elsewhere."""
import numpy as np
import pytest

import minfer
from conftest import layout_model
from cuda_cases import M, U, UB, UH, forward, fused_decode_nodes, q15, random_weight, _gpu  # noqa: F401 (fixtures)
from minfer.quants import dequantize
from quant_helpers import MIN_FIELDS, with_min_zeroed

pytestmark = pytest.mark.gpu


# ---- rung 1: matmul kernels against float64 -----------------------------------------------

Q8_DECODE = {"q4_0", "q5_0", "q8_0", "q4_k", "q6_k"}  # types with the 8-bit-activation matvec


@pytest.mark.parametrize("path", ["f32", "q8", "gemm"])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 33, 64, 77, 512])  # 5-64: gemm_q, beyond: dequantize then GEMM
@pytest.mark.parametrize("wtype,n,k", [
    ("q4_k", 1536, 8960), ("q6_k", 8960, 1536), ("q5_k", 896, 4864), ("q5_0", 4864, 896), ("q8_0", 896, 4864),
    ("q4_0", 3584, 3584), ("q4_1", 1536, 576), ("q5_1", 576, 1536), ("f16", 896, 896), ("f32", 256, 1536),
    ("iq4_nl", 1536, 8960), ("iq4_xs", 896, 4864), ("iq4_xs", 256, 1536), ("bf16", 576, 1536)])
def test_matmul_against_float64(rng, wtype, n, k, rows, path):
    if (path == "gemm") != (rows > 4) or (path == "q8" and wtype not in Q8_DECODE):
        pytest.skip(f"no {path} path for {rows} rows of {wtype}")
    check_against_float64(rng, wtype, n, k, rows, path)


def check_against_float64(rng, wtype, n, k, rows, path):
    t, w = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    y, _ = M.cuda_matmul(t, w, x, n, path=path)
    W = dequantize(w, t).reshape(n, k).astype(np.float64)
    ref = x.astype(np.float64) @ W.T
    S = np.abs(x).astype(np.float64) @ np.abs(W).T
    mins = None  # |q s| + |m| per weight where a type has a min: bf16 rounds q s and m apart
    if path == "bf16" and t in MIN_FIELDS:
        parts = [dequantize(with_min_zeroed(t, w.reshape(-1), keep), t) for keep in ("scale", "min")]
        mins = (np.abs(parts[0]) + np.abs(parts[1])).reshape(n, k).astype(np.float64)
    if path == "f32":  # matvec: f32 products summed in f32 (gamma_K)
        bound = 2 * k * U * S
    elif path in ("q8", "mma"):  # x rounded to 8 bits per 32 values (error <= d / 2, d = amax / 127), then as f32
        d = np.abs(x).astype(np.float64).reshape(rows, k // 32, 32).max(-1) / 127
        bound = 0.5 * (1 + 1e-5) * (d @ np.abs(W).reshape(n, k // 32, 32).sum(-1).T) + 2 * k * U * S
    elif path == "bf16":  # x and each weight's scale and scaled quant (q s - m) rounded to bf16, f32 sums
        A = np.abs(W) if mins is None else mins
        bound = (3.1 * UB + 2 * k * U) * (np.abs(x).astype(np.float64) @ A.T)
    else:              # tensor cores: x and W rounded to f16 (relative UH, or half a subnormal step), f32 sums
        bound = (2 * UH + 2 * k * U) * S + 2.0 ** -25 * np.abs(x).sum(1, keepdims=True)
    err = np.abs(y - ref)
    assert np.all(np.isfinite(y))
    assert np.all(err <= bound + 1e-30), f"max err {err.max():.3g}, worst ratio {(err / (bound + 1e-30)).max():.3g}"


MMA = [("q4_k", 1536, 8960), ("q4_k", 1003, 2048), ("q6_k", 8960, 1536), ("q6_k", 77, 3584), ("q8_0", 896, 4864),
       ("q8_0", 1003, 896)]


# The bf16 product copies 64 weight rows a stage as one tensor copy where rows are 16-byte multiples, a copy a
# row where not (Q8_0 at an odd count of 128-value slices: 896); 1280 (five 256-value groups) takes the first.
MMA_BF16 = MMA + [("q8_0", 1003, 1280)]


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 17, 33, 64])
@pytest.mark.parametrize("path,wtype,n,k", [("mma", *s) for s in MMA] + [("bf16", *s) for s in MMA_BF16])
def test_mma_matmul_against_float64(rng, wtype, n, k, rows, path):
    """A batch's decode product on the tensor cores (1, 2, 4 and 8 tiles of 8 rows; rows past N and M; K split
    where the shape asks) against float64: int8 (gemm_q8) with the bound of rounding x to 8 bits, bf16
    (gemm_mma) with that of rounding x and the scaled quants to bf16."""
    check_against_float64(rng, wtype, n, k, rows, path)


@pytest.mark.parametrize("rows", [3, 16, 64])
@pytest.mark.parametrize("wtype,n,k", [("q4_k", 18944, 3584), ("q6_k", 3584, 18944)])
def test_bf16_matmul_at_the_7b_shapes(rng, wtype, n, k, rows):
    """The bf16 product at the 7B's gate and down shapes (K split over blocks, 1, 2 and 8 tiles of rows) against
    float64."""
    check_against_float64(rng, wtype, n, k, rows, "bf16")


@pytest.mark.parametrize("path,wtype,n,k", [(p, *s) for p in ("mma", "bf16") for s in MMA[::2]])
def test_mma_rows_do_not_depend_on_the_batch(rng, wtype, n, k, path):
    """A row's product is the same bits whatever other rows share the call: integer sums, the same split and the
    same order of the f32 adds at every row count."""
    t, w = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((64, k)).astype(np.float32)
    full, _ = M.cuda_matmul(t, w, x, n, path=path)
    for rows in (2, 7, 11, 40):
        part, _ = M.cuda_matmul(t, w, x[:rows], n, path=path)
        assert np.array_equal(part, full[:rows]), rows


@pytest.mark.parametrize("wtype,n,k", [("q4_k", 18944, 3584), ("q4_k", 1003, 2048), ("q6_k", 3584, 18944),
                                       ("q6_k", 77, 1536)])
def test_two_row_matvec(rng, wtype, n, k):
    """The 8-bit matvec's rows kernel (each weight chunk loaded once for two activation rows: a batch step of two
    sequences) against float64 with the bound of rounding x to 8 bits (rows past a block's 8: n = 1003, 77), and
    each row the bits of the one-row decode matvec on it (the same chunks, lanes and warps in the same order)."""
    check_against_float64(rng, wtype, n, k, 2, "q8")
    t, w = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((2, k)).astype(np.float32)
    y, _ = M.cuda_matmul(t, w, x, n, path="q8")
    for r in range(2):
        assert np.array_equal(y[r], M.cuda_matmul(t, w, x[r:r + 1], n, path="q8")[0][0]), r


def test_two_row_matvec_choice(rng, force):
    """Two rows take the rows kernel, cuda.matvec=warp the warp kernel (other sums, the same bound)."""
    t, w = random_weight("q4_k", 64, 2048, rng)
    x = rng.standard_normal((2, 2048)).astype(np.float32)
    rows_kernel = M.cuda_matmul(t, w, x, 64, path="q8")[0]
    force("cuda.matvec", "warp")
    warp = M.cuda_matmul(t, w, x, 64, path="q8")[0]
    assert not np.array_equal(warp, rows_kernel)
    assert np.abs(warp - rows_kernel).max() <= 1e-4 * np.abs(rows_kernel).max()


@pytest.mark.parametrize("kernel", ["block", "warp"])
@pytest.mark.parametrize("wtype,n,k", [("q4_k", 1003, 2048), ("q6_k", 13, 1536), ("q5_0", 101, 896),
                                       ("q8_0", 1000, 4864), ("q4_0", 8, 3584)])
def test_one_row_matvec_kernels(rng, force, kernel, wtype, n, k):
    """Both kernels for one activation row (8 rows a block with K split over its warps, and a warp
    per row), forced by the kernel choice whatever the row length, on row counts that leave a block part
    empty and rows shorter than the block's 32 lanes slots."""
    force("cuda.matvec", kernel)
    check_against_float64(rng, wtype, n, k, 1, "q8")


def test_one_row_matvec_rule(rng, force):
    """The dispatch rule: Q4_K rows of 2048 take the block kernel, Q8_0 rows the warp kernel."""
    t, w = random_weight("q4_k", 64, 2048, rng)
    x = rng.standard_normal((1, 2048)).astype(np.float32)
    res = {}
    for v in ("block", "warp"):
        force("cuda.matvec", v)
        res[v] = M.cuda_matmul(t, w, x, 64, path="q8")[0]
    assert not np.array_equal(res["block"], res["warp"])  # the sums are ordered differently
    force("cuda.matvec", "auto")  # the rule: K-quant rows of K >= 1024 take the block kernel
    assert np.array_equal(M.cuda_matmul(t, w, x, 64, path="q8")[0], res["block"])
    t8, w8 = random_weight("q8_0", 64, 2048, rng)
    auto = M.cuda_matmul(t8, w8, x, 64, path="q8")[0]
    force("cuda.matvec", "warp")
    assert np.array_equal(auto, M.cuda_matmul(t8, w8, x, 64, path="q8")[0])


@pytest.mark.parametrize("wtype,n,k,pipe", [("q4_k", 1003, 2048, "1"), ("q4_k", 4608, 3584, "1"), ("q4_k", 64, 7936, "1"),
                                            ("q4_k", 13, 256, "1"), ("q4_k", 16, 18944, "1"), ("q6_k", 300, 3584, "all")])
def test_pipe_matvec(rng, force, wtype, n, k, pipe):
    """Rows with x in shared memory and each lane's Q4_K weights loaded a chunk ahead (the pipe kernel) give
    exactly the block kernel's sums -- the same chunks per lane, summed in the same order -- with rows that end
    mid-block, rows shorter than a block's 32 lane slots (K = 256), rows of 8192 or more (K = 18944: the block
    kernel takes them) and Q6_K rows (walked as the block kernel walks them; only with the choice at 'all');
    within the float64 bound."""
    t, w = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    force("cuda.matvec", "block")
    force("cuda.matvec_stage", "off")
    res = {}
    for v in ("0", pipe):
        force("cuda.matvec_pipe", v)
        res[v] = M.cuda_matmul(t, w, x, n, path="q8")[0]
    assert np.array_equal(res["0"], res[pipe])
    # one or two chunks ahead, or a lane's whole row (K <= 4096: at most two chunks): the same chunks, summed in
    # the same order
    for ahead in ("1", "2") + (("whole",) if k <= 4096 else ()):
        force("cuda.pipe_ahead", ahead)
        assert np.array_equal(res["0"], M.cuda_matmul(t, w, x, n, path="q8")[0]), ahead
    if 4096 < k < 8192:  # a third chunk a lane: the whole-row build cannot take it
        force("cuda.pipe_ahead", "whole")
        with pytest.raises(minfer.MinferError, match="more than two chunks a lane"):
            M.cuda_matmul(t, w, x, n, path="q8")
    force("cuda.pipe_ahead", "auto")
    check_against_float64(rng, wtype, n, k, 1, "q8")


@pytest.mark.parametrize("wtype,n,k", [("q4_k", 1003, 2048), ("q6_k", 13, 1536), ("q6_k", 300, 3584),
                                       ("q4_k", 64, 8960)])
def test_block_matvec_staging(rng, force, wtype, n, k):
    """The block kernel's weight rows copied into shared memory first (before the PDL wait) give exactly
    the sums the reads from global memory give -- the same loads, another place -- including row counts
    whose last block is not staged (1003, 13, 300 rows); by rule, rows of at most 12 KB a block (8 rows)
    are staged and longer ones not (Q4_K rows shorter than 8192 take the pipe kernel instead, with the
    same bits)."""
    t, w = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    force("cuda.matvec", "block")
    res = {}
    for v in ("off", "before"):
        force("cuda.matvec_stage", v)
        res[v] = M.cuda_matmul(t, w, x, n, path="q8")[0]
    assert np.array_equal(res["off"], res["before"])
    force("cuda.matvec_stage", "auto")
    auto = M.cuda_matmul(t, w, x, n, path="q8")[0]
    assert np.array_equal(auto, res["before"] if 8 * w.shape[1] <= 12 * 1024 else res["off"])
    check_against_float64(rng, wtype, n, k, 1, "q8")


@pytest.mark.parametrize("n,k", [(300, 3584), (1000, 8960), (77, 1536)])
def test_q6k_block_builds(rng, force, n, k):
    """The block kernel's Q6_K builds -- unrolled by two where a lane has a second chunk (K > 2048: 3584, 8960),
    rolled where it has one (1536) -- within the float64 bound."""
    force("cuda.matvec", "block")
    force("cuda.matvec_stream", "0")  # the block kernel's builds (K >= 8192 would take the stream)
    check_against_float64(rng, "q6_k", n, k, 1, "q8")


def block_kernel_case(rng, force, wtype, n, k):
    """Random rows of a type and one x row, the kernel choices set to the block kernel's family (block, pipe: not the
    warp or the stream kernel), and its result: (type, w, x, y)."""
    t, w = random_weight(wtype, n, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    force("cuda.matvec", "block")
    force("cuda.matvec_stream", "0")
    return t, w, x, M.cuda_matmul(t, w, x, n, path="q8")[0]


@pytest.mark.parametrize("wtype,n,k,spreads", [("q6_k", 300, 18944, True), ("q4_k", 1001, 8960, True),
                                               ("q6_k", 3584, 3584, True), ("q6_k", 8000, 3584, True),
                                               ("q4_k", 3584, 3584, False), ("q6_k", 13, 1536, False)])
def test_spread_matvec(rng, force, wtype, n, k, spreads):
    """cuda.matvec_spread: a launch of the block kernel unrolled by two (Q6_K / Q4_K rows of 8192 and more, Q6_K
    rows past 2048) deals its rows evenly to whole waves of blocks (1-8 a block: 300 rows one a block, 1001 one or
    two, 3584 six or seven; 8000 rows, more than a wave of 8 a block, over two waves) and gives the
    8-rows-a-block launch's bits, under auto (the default), 1 and only; =only shows it ran, and raises for the
    pipe kernel (Q4_K rows of 3584: no spread build) and the rolled Q6_K build."""
    t, w, x, base = block_kernel_case(rng, force, wtype, n, k)
    force("cuda.matvec_spread", "only")
    if spreads:
        assert np.array_equal(M.cuda_matmul(t, w, x, n, path="q8")[0], base)
    else:
        with pytest.raises(minfer.MinferError, match="cuda.matvec_spread=only: "):
            M.cuda_matmul(t, w, x, n, path="q8")
    for v in ("1", "0", "auto"):
        force("cuda.matvec_spread", v)
        assert np.array_equal(M.cuda_matmul(t, w, x, n, path="q8")[0], base), v


def test_spread_not_on_fused_parts(q15, rng, force):
    """The pipe kernel has no spread build (spreading its whole-row build measured slower):
    the 1.5B's launches of several parts -- q, k and v (Q4_K, Q4_K, Q6_K) and gate and up with SwiGLU -- in its
    whole-row build raise under cuda.matvec_spread=only, and give the same bits under 1 as under 0."""
    m, s = q15
    x = rng.standard_normal((1, 1536)).astype(np.float32)
    nodes = fused_decode_nodes("blk.5.")
    force("cuda.matvec", "block")
    force("cuda.pipe_ahead", "whole")
    force("cuda.matvec_spread", "0")
    base = s.run_ops("cuda", [x], nodes)
    force("cuda.matvec_spread", "1")
    for a, b in zip(base, s.run_ops("cuda", [x], nodes)):
        assert np.array_equal(a, b)
    force("cuda.matvec_spread", "only")
    with pytest.raises(minfer.MinferError, match="cuda.matvec_spread=only: this launch's kernel has no spread"):
        s.run_ops("cuda", [x], nodes)


def test_spread_decode_is_bit_exact(rng, force):
    """The 1.5B layout decodes to the same logits with cuda.matvec_spread=1 as with 0: its downs (Q4_K and
    Q6_K rows of 8960, the block kernel unrolled by two, 192 blocks of 8 rows where a wave holds 4 an SM; auto
    leaves them, under half a wave) are spread, graph replays included.  (=only raises in the same decode: its
    launches read the forced choice, and its other matvecs have no spread build.)"""
    model = M.Model(str(layout_model("qwen2.5-coder-1.5b-instruct-q4_k_m")))
    prompt = rng.integers(0, 151936, size=7).astype(np.int32)
    force("cuda.matvec_spread", "0")
    base, _ = forward(model, "cuda", prompt, 6, n_ctx=64)
    force("cuda.matvec_spread", "1")
    spread, _ = forward(model, "cuda", prompt, 6, n_ctx=64)
    assert np.array_equal(base, spread)
    force("cuda.matvec_spread", "only")
    with pytest.raises(minfer.MinferError, match="cuda.matvec_spread=only: "):
        forward(model, "cuda", prompt, 1, n_ctx=64)


@pytest.mark.parametrize("wtype,n,k", [("q6_k", 35003, 1536), ("q4_k", 34001, 2048), ("q6_k", 300, 18944),
                                       ("q4_k", 299, 18944), ("q6_k", 36000, 3584), ("q6_k", 13, 1536),
                                       ("q4_k", 40, 512)])
def test_stream_matvec(rng, force, wtype, n, k):
    """The stream kernel -- the block kernel's rows and lanes, each lane's chunks loaded ahead of the one it
    computes and the stream running on across a block's groups of 8 rows -- gives the block kernel's bits.  The
    rule takes vocabulary-like launches (more groups than 8 waves of blocks: the grid is smaller than the groups,
    so every block walks several) with one chunk a lane, or two of Q6_K (the 36000 x 3584 case);
    cuda.matvec_stream=only forces it on long rows (a lane walks 9-10 chunks), two chunks a lane, short rows and
    a last group of 3-7 rows, and raises where it cannot run, so each case shows it ran.  Within the float64
    bound."""
    t, w, x, block = block_kernel_case(rng, force, wtype, n, k)
    force("cuda.matvec_stream", "auto")
    assert np.array_equal(M.cuda_matmul(t, w, x, n, path="q8")[0], block)
    force("cuda.matvec_stream", "only")
    for ahead in ("1", "2") if wtype == "q4_k" else ("auto",):
        force("cuda.stream_ahead", ahead)
        assert np.array_equal(M.cuda_matmul(t, w, x, n, path="q8")[0], block), ahead
    force("cuda.stream_ahead", "auto")
    if n * k < 2e7:  # the float64 reference of the largest cases would take a minute of CPU
        check_against_float64(rng, wtype, n, k, 1, "q8")


def test_stream_matvec_only_raises_where_it_cannot_run(q15, force):
    """cuda.matvec_stream=only on a whole decode step: the fused gate/up (swiglu, two parts) cannot take the
    stream kernel, and says so instead of running another kernel."""
    m, _ = q15
    force("cuda.matvec_stream", "only")
    with pytest.raises(minfer.MinferError, match="cuda.matvec_stream=only: this launch is not one part"):
        M.Session(m, threads=2, n_ctx=64, device="cuda").eval(np.array([1], np.int32), 0)


def test_decode_activations_choice(rng, force):
    """auto takes the 8-bit-activation matvec (it computes differently from the f32 one);
    cuda.decode_activations=f32 switches back."""
    t, w = random_weight("q4_k", 64, 512, rng)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    q8 = M.cuda_matmul(t, w, x, 64)[0]
    assert np.array_equal(q8, M.cuda_matmul(t, w, x, 64, path="q8")[0])
    force("cuda.decode_activations", "f32")
    f32 = M.cuda_matmul(t, w, x, 64)[0]
    assert np.array_equal(f32, M.cuda_matmul(t, w, x, 64, path="f32")[0]) and not np.array_equal(f32, q8)
