"""Rung 1 for the dot products.

1. Every SIMD kernel equals its scalar reference.  The integer work is exact in
   both, so where a SIMD kernel does the float part per 256-value super-block in
   the reference's order (Q2_K, Q3_K, Q5_K, IQ4_XS; every NEON K-quant) the results are
   bit-identical.  The 32-value types, the float types, x86's Q6_K (8 float
   lanes across super-blocks, one horizontal sum per row) and x86's Q4_K (fused
   multiply-adds of each super-block's two integer sums) round differently, and
   the allowed difference is the float rounding:
       |simd - ref| <= 2 * (n_terms + 4) * u * S,   u = 2^-24,
   where S = sum of |term| over the products (a standard bound for two
   different orders of summing n_terms terms, each with a few roundings); for
   the lane-summed K-quants n_terms counts the 16-value sub-blocks.
2. The rows kernels (the GEMM's unit: one weight row x 1 or 4 tokens, with the
   activation scales pre-converted) equal the same ISA's single-token kernel
   bit for bit: per token they do the same operations.
   The four-row units (the Q4_K and Q5_0 tiles; AVX2's Q6_K four-row decode kernel) equal them too, row
   by row.
3. The scalar reference is within the activation quantization error of a
   float64 dot product of the (dequantized) weights with the float activations.
"""
import numpy as np
import pytest

from conftest import all_isas, require_isa
from minfer.quants import GGMLType as T, WEIGHT_TYPES, dequantize, quantize_act, type_info, vec_dot, vec_dot_type
from minfer import _minfer as native
from quant_helpers import MIN_FIELDS, parse_act, random_weight_row, with_min_zeroed

U = 2.0 ** -24
K_QUANTS = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS}  # (IQ4_XS: 256-value super-blocks of Q8_K)
LANE_SUMMED = {("avx2", T.Q4_K), ("avx2", T.Q6_K), ("avx512", T.Q4_K), ("avx512", T.Q6_K)}
# real row lengths: qwen2.5 1.5B hidden / ffn, 0.5B hidden, smollm2 hidden
LENGTHS = [1536, 8960, 896, 576]


def lengths_for(t):
    bs = type_info(t)[1]
    return [n for n in LENGTHS if n % bs == 0 and n % type_info(vec_dot_type(t))[1] == 0]


def abs_term_sum(t, w_row, a_vals, n):
    """S: sum of |products|, with the min/offset part of the weights counted apart."""
    if t in MIN_FIELDS:
        ws = dequantize(with_min_zeroed(t, w_row, "scale"), t).astype(np.float64)
        wm = dequantize(with_min_zeroed(t, w_row, "min"), t).astype(np.float64)
        return float(np.sum(np.abs(ws * a_vals)) + np.sum(np.abs(wm * a_vals)))
    w = dequantize(w_row, t).astype(np.float64)
    return float(np.sum(np.abs(w * a_vals)))


@pytest.mark.parametrize("isa", [i for i in all_isas() if i != "scalar"])
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_simd_matches_scalar(isa, t, rng):
    require_isa(isa)
    for n in lengths_for(t):
        for trial in range(20):
            w = random_weight_row(rng, t, n)
            x = (rng.standard_normal(n) * (1 + 3 * (trial % 3))).astype(np.float32)
            a = quantize_act(x, vec_dot_type(t))
            ref = vec_dot(t, w, a, "scalar")
            got = vec_dot(t, w, a, isa)
            if t in K_QUANTS and (isa, t) not in LANE_SUMMED:
                assert got == ref, f"{t.name} n={n}: {got!r} != {ref!r} (expected bit-identical)"
            else:
                a_vals = parse_act(vec_dot_type(t), a, n)[0]
                n_terms = n // 16 if t in K_QUANTS else n // type_info(t)[1] if t not in (T.F32, T.F16, T.BF16) else n
                tol = 2 * (n_terms + 4) * U * abs_term_sum(t, w, a_vals, n)
                assert abs(got - ref) <= tol, f"{t.name} n={n}: |{got} - {ref}| > {tol}"


ROWS_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]  # the real models' types


@pytest.mark.parametrize("isa", ["avx2", "avx512"])  # the rows kernels are x86-only so far
@pytest.mark.parametrize("t", ROWS_TYPES, ids=lambda t: t.name)
def test_rows_match_dot(isa, t, rng):
    require_isa(isa)
    assert native.has_dot_rows(t, isa), f"{t.name} lost its {isa} rows kernel"
    for n in lengths_for(t):
        for trial in range(10):
            w = random_weight_row(rng, t, n)
            x = (rng.standard_normal((8, n)) * (1 + 3 * (trial % 3))).astype(np.float32)
            a = np.stack([quantize_act(x[k], vec_dot_type(t)) for k in range(8)])
            want = [vec_dot(t, w, a[k], isa) for k in range(8)]
            assert native.vec_dot_rows(t, w, a, isa) == want, f"{t.name} n={n}: 8 tokens"
            assert native.vec_dot_rows(t, w, a[4:], isa) == want[4:], f"{t.name} n={n}: 4 tokens"
            assert native.vec_dot_rows(t, w, a[5:7], isa) == want[5:7], f"{t.name} n={n}: 2 tokens"
            assert native.vec_dot_rows(t, w, a[2], isa) == want[2:3], f"{t.name} n={n}: 1 token"


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_scalar_reference_vs_float64(t, rng):
    at = vec_dot_type(t)
    for n in lengths_for(t):
        for trial in range(10):
            w = random_weight_row(rng, t, n)
            x = rng.standard_normal(n).astype(np.float32)
            a = quantize_act(x, at)
            a_vals, d, s = parse_act(at, a, n)
            got = vec_dot(t, w, a, "scalar")
            wv = dequantize(w, t).astype(np.float64)
            # (1) exact arithmetic on the quantized operands: only float rounding differs
            exact_q = float(np.dot(wv, a_vals))
            S = abs_term_sum(t, w, a_vals, n)
            slack = 0.0
            if t in (T.Q4_1, T.Q5_1):  # s = d * sum(q) is stored in f16
                m = w.reshape(-1, type_info(t)[2])[:, 2:4].copy().view(np.float16).astype(np.float64)[:, 0]
                qsum = a_vals.reshape(-1, 32).sum(1)
                slack = float(np.sum(np.abs(m * (s - qsum))))
            n_terms = n if t in (T.F32, T.F16, T.BF16) else n // type_info(t)[1]
            assert abs(got - exact_q) <= 2 * (n_terms + 4) * U * S + slack * 1.0001, t.name
            # (2) against the float activations: within the activation quantization error
            exact = float(np.dot(wv, x.astype(np.float64)))
            qerr = float(np.sum(np.abs(wv) * np.abs(a_vals - x)))
            assert abs(got - exact) <= qerr + 2 * (n_terms + 4) * U * S + slack * 1.0001 + 1e-12, t.name
            if at != T.F32:
                # and that error is small: the activations are quantized to 8 bits
                assert qerr <= 0.01 * float(np.sum(np.abs(wv * x))) + 1e-9


def test_isa_selection():
    import os
    import subprocess
    import sys

    from minfer.quants import available_isas, default_isa

    assert "scalar" in available_isas()
    assert default_isa() == available_isas()[-1]  # the best one
    code = "import minfer.quants as q; print(q.default_isa())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MINFER_CPU_ISA": "scalar"},
                         capture_output=True, text=True)
    assert out.stdout.strip() == "scalar", out.stderr
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MINFER_CPU_ISA": "sse9"},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "MINFER_CPU_ISA='sse9': must be one of auto, scalar, avx2, avx512, neon" in bad.stderr


def test_unavailable_isa_is_an_error():
    import minfer
    from minfer.quants import available_isas

    missing = [i for i in ("avx2", "avx512", "neon") if i not in available_isas()]
    if not missing:
        pytest.skip("every ISA is available on this machine")
    with pytest.raises(minfer.MinferError, match="not (supported by this CPU|compiled into this build)"):
        vec_dot(T.Q8_0, np.zeros(34, np.uint8), np.zeros(34, np.uint8), missing[0])


TILE4 = [("avx2", T.Q4_K), ("avx2", T.Q5_0), ("avx2", T.Q6_K), ("avx2", T.Q8_0), ("avx512", T.Q4_K),
         ("avx512", T.Q5_0), ("avx512", T.Q8_0)]


@pytest.mark.parametrize("t", [T.Q5_0, T.Q8_0], ids=lambda v: v.name)
def test_tile8_matches_dot(t, rng):
    """AVX-512 VNNI's eight-row unit (one 512-bit product a token for eight rows) gives each row's single-token
    result bit for bit at 2, 4, 8 and 16 tokens, as the four-row tile does."""
    require_isa("avx512")
    assert native.has_dot_tile8(t, "avx512"), f"{t.name} lost its eight-row tile"
    for n in lengths_for(t):
        for trial in range(4):
            w = np.stack([random_weight_row(rng, t, n) for _ in range(8)])
            x = (rng.standard_normal((16, n)) * (1 + 3 * (trial % 3))).astype(np.float32)
            a = np.stack([quantize_act(x[k], vec_dot_type(t)) for k in range(16)])
            want = np.array([[vec_dot(t, w[r], a[k], "avx512") for r in range(8)] for k in range(16)], np.float32)
            for lo, hi in ((0, 16), (3, 11), (6, 10), (9, 11)):
                got = native.vec_dot_tile8(t, w, a[lo:hi], "avx512")
                assert np.array_equal(got, want[lo:hi]), f"{t.name} n={n}: {hi - lo} tokens"


@pytest.mark.parametrize("isa,t", TILE4, ids=lambda v: v if isinstance(v, str) else v.name)
def test_tile4_matches_dot(isa, t, rng):
    """The GEMM's four-row unit (the tiles; AVX2's Q6_K four-row decode kernel) gives each
    row's single-token result bit for bit, at 1 (decode's four-row kernel), 2, 4 and 8 tokens: the GEMM may
    cut rows into tiles or not without changing a logit."""
    require_isa(isa)
    assert native.has_dot_tile4(t, isa), f"{t.name} lost its {isa} tile kernel"
    for n in lengths_for(t):
        for trial in range(6):
            w = np.stack([random_weight_row(rng, t, n) for _ in range(4)])
            x = (rng.standard_normal((8, n)) * (1 + 3 * (trial % 3))).astype(np.float32)
            a = np.stack([quantize_act(x[k], vec_dot_type(t)) for k in range(8)])
            want = np.array([[vec_dot(t, w[r], a[k], isa) for r in range(4)] for k in range(8)], np.float32)
            assert np.array_equal(native.vec_dot_tile4(t, w, a, isa), want), f"{t.name} n={n}: 8 tokens"
            assert np.array_equal(native.vec_dot_tile4(t, w, a[4:], isa), want[4:]), f"{t.name} n={n}: 4 tokens"
            assert np.array_equal(native.vec_dot_tile4(t, w, a[5:7], isa), want[5:7]), f"{t.name} n={n}: 2 tokens"
            assert np.array_equal(native.vec_dot_tile4(t, w, a[2], isa), want[2:3]), f"{t.name} n={n}: 1 token"
            if native.has_dot_tile16(t, isa):  # the VNNI tile takes 16 tokens: the same bits again
                a16 = np.concatenate([a, a[::-1]])
                assert np.array_equal(native.vec_dot_tile4(t, w, a16, isa), np.concatenate([want, want[::-1]])), \
                    f"{t.name} n={n}: 16 tokens"


@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_vnni_kernels_match_avx2(t, rng):
    """The AVX-512 build runs AVX2's four-row units with vpdpbusd / vpdpwssd in place of vpmaddubsw + vpmaddwd
    where several tokens share a weight block: the integers are the same, so every unit (1, 2, 4, 8 tokens) and
    the single dot give AVX2's bits, and an AVX-512 machine computes the logits an AVX2 one does."""
    require_isa("avx2")
    require_isa("avx512")
    for n in lengths_for(t):
        for trial in range(6):
            w = np.stack([random_weight_row(rng, t, n) for _ in range(4)])
            x = (rng.standard_normal((8, n)) * (1 + 3 * (trial % 3))).astype(np.float32)
            a = np.stack([quantize_act(x[k], vec_dot_type(t)) for k in range(8)])
            if native.has_dot_tile4(t, "avx512"):
                for rows in (a, a[4:], a[5:7], a[2]):
                    assert np.array_equal(native.vec_dot_tile4(t, w, rows, "avx512"),
                                          native.vec_dot_tile4(t, w, rows, "avx2")), f"{t.name} n={n}: {rows.shape}"
            for rows in (a, a[4:], a[5:7], a[2]):
                assert native.vec_dot_rows(t, w[0], rows, "avx512") == native.vec_dot_rows(t, w[0], rows, "avx2"), \
                    f"{t.name} n={n}: {rows.shape}"
            assert vec_dot(t, w[1], a[3], "avx512") == vec_dot(t, w[1], a[3], "avx2"), f"{t.name} n={n}"
