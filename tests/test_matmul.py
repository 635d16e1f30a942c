"""Rung 1 for the matrix products at real model shapes: matmul (every ISA, 1-3
threads, 1 and many tokens, poisoned output) against the float64 reference
over the same quantized operands."""
import numpy as np
import pytest

import minfer
from conftest import all_isas, require_isa
from minfer.quants import GGMLType as T, ThreadPool, dequantize, matmul, matmul_ref, type_info, vec_dot_type
from quant_helpers import random_weight_row

U = 2.0 ** -24


def random_matrix(rng, t, rows, cols):
    return np.stack([random_weight_row(rng, t, cols) for _ in range(rows)])


def check(y, w, t, x, ref=None):
    """|y - ref| per element within the float rounding of the dot product."""
    ref = matmul_ref(w, t, x) if ref is None else ref
    rows, cols = ref.shape[1], x.shape[-1]
    wv = dequantize(w, t).reshape(rows, cols).astype(np.float64)
    at = vec_dot_type(t)
    xs = np.stack([dequantize(minfer.quants.quantize_act(r, at), at) for r in x]).astype(np.float64)
    S = np.abs(xs) @ np.abs(wv).T  # [n_tok, rows]: sum |w||a|
    n_terms = cols // type_info(t)[1] + cols // 16 + 8
    assert np.all(np.isfinite(y)), "unwritten (poisoned) outputs remain"
    bad = np.abs(y - ref) > 4 * n_terms * U * S + 1e-30
    assert not bad.any(), f"{bad.sum()} elements off, e.g. {np.argwhere(bad)[:4]}"


SHAPES = [(1536, 1536), (256, 8960), (8960 // 8, 1536)]  # (rows, cols): 1.5B attention / ffn_down / ffn_up slices


@pytest.mark.parametrize("isa", all_isas())
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
                               T.IQ4_NL, T.IQ4_XS, T.F16, T.F32, T.BF16], ids=lambda t: t.name)
def test_matvec_and_matmul(isa, t, rng):
    require_isa(isa)
    for rows, cols in SHAPES[:2] if t in (T.F32, T.BF16) else SHAPES:
        w = random_matrix(rng, t, rows, cols)
        for n_tok in (1, 7, 33):
            x = rng.standard_normal((n_tok, cols)).astype(np.float32)
            y = np.full((n_tok, rows), np.nan, np.float32)
            pool = ThreadPool(1 + n_tok % 3)
            matmul(w, t, x, pool=pool, isa=isa, out=y)
            check(y, w, t, x)


def test_threads_agree_exactly(rng):
    # the split over threads must not change a single bit (each dot is done by one thread)
    w = random_matrix(rng, T.Q4_K, 999, 1536)
    x = rng.standard_normal((5, 1536)).astype(np.float32)
    ys = [matmul(w, T.Q4_K, x, pool=ThreadPool(n)) for n in (1, 2, 3, 8)]
    for y in ys[1:]:
        assert np.array_equal(ys[0], y)


@pytest.mark.parametrize("rows", [1, 15, 17, 64, 1003, 2051])
def test_decode_split_covers_every_row_once(rng, rows):
    """A decode matvec's rows are shared by ThreadPool.parallel_ranges: one forward run a thread, claimed from
    its front, the rest taken from its back by threads done first.  At 1, 2, 3 and 8 threads, for row counts
    that are not multiples of its 16-row groups or 64-row claims, every output (poisoned with NaN first) is
    written, agrees with the reference, and has the same bits at every thread count."""
    w = random_matrix(rng, T.Q4_K, rows, 512)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    ref = None
    for n in (1, 2, 3, 8):
        y = np.full((1, rows), np.nan, np.float32)
        matmul(w, T.Q4_K, x, pool=ThreadPool(n), out=y)
        if ref is None:
            check(y, w, T.Q4_K, x)
            ref = y
        assert np.array_equal(y, ref), n


@pytest.mark.parametrize("isa", [i for i in all_isas() if i != "scalar"])
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_batch_does_not_change_a_token(isa, t, rng):
    """A token's outputs are the same bits whether it is multiplied alone (decode's kernel) or inside a batch
    of 27 or 91 (the GEMM: tiles of 64 tokens run as 8 + 4 + 1-token steps, four weight rows at a time where
    the ISA has a tile kernel, the rest row by row; 18 rows leave a partial tile; 91 = a full token tile and
    a partial one)."""
    require_isa(isa)
    w = random_matrix(rng, t, 18, 1536)
    x = rng.standard_normal((91, 1536)).astype(np.float32)
    pool = ThreadPool(2)
    alone = np.concatenate([matmul(w, t, x[k:k + 1], pool=pool, isa=isa) for k in range(91)])
    assert np.array_equal(matmul(w, t, x[:27], pool=pool, isa=isa), alone[:27]), "27 tokens"
    batch = matmul(w, t, x, pool=pool, isa=isa)
    assert np.array_equal(batch, alone), np.argwhere(batch != alone)[:4]


def test_real_weights_qwen15(qwen15_path, rng):
    f = minfer.gguf.open(qwen15_path)
    pool = ThreadPool(minfer.quants.physical_cores())
    for name in ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight", "output.weight"]:
        info = f.tensors[name]
        w = info.data
        if name == "output.weight":
            w = w[:4096]  # 151936 x 1536 in full; the float64 check over all rows is slow
        cols = info.shape[-1]
        x = rng.standard_normal((3, cols)).astype(np.float32)
        y = np.full((3, w.shape[0]), np.nan, np.float32)
        matmul(w, info.type, x, pool=pool, out=y)
        check(y, np.ascontiguousarray(w), info.type, x)


def test_errors():
    w = np.zeros((4, 144), np.uint8)
    with pytest.raises(minfer.MinferError, match="not a multiple of the Q4_K block size 256"):
        matmul(w, T.Q4_K, np.zeros((1, 200), np.float32))
    with pytest.raises(minfer.MinferError, match="not a whole number of Q4_K rows"):
        matmul(np.zeros(100, np.uint8), T.Q4_K, np.zeros((1, 256), np.float32))
    with pytest.raises(minfer.MinferError, match="out must be"):
        matmul(w, T.Q4_K, np.zeros((1, 256), np.float32), out=np.zeros(3, np.float32))
