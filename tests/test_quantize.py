"""Quantizers: the reference weight quantizers match `gguf.quants.quantize` bit
for bit; the activation quantizers round-trip within their quantization error,
and each ISA's activation quantizer writes the reference's bytes."""
import numpy as np
import pytest

from minfer.quants import GGMLType as T, available_isas, dequantize, quantize, quantize_act
from quant_helpers import parse_act

gguf = pytest.importorskip("gguf", reason="the PyPI `gguf` package is the independent oracle")
from gguf import quants as gq  # noqa: E402

REF_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def inputs(rng):
    n = 32 * 64
    yield "normal", rng.standard_normal(n).astype(np.float32)
    yield "wide", (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(np.float32)
    yield "positive", rng.uniform(0.1, 1.0, n).astype(np.float32)
    z = rng.standard_normal(n).astype(np.float32)
    z[:32] = 0.0        # an all-zero block (d = 0)
    z[32:64] = 1.5      # a constant block
    yield "edge", z
    yield "halfway", (np.round(rng.standard_normal(n) * 8) / 8 + 1 / 16).astype(np.float32)


@pytest.mark.parametrize("t", REF_TYPES, ids=lambda t: t.name)
def test_reference_quantizer_matches_gguf(t, rng):
    for label, x in inputs(rng):
        ours = quantize(x, t)
        theirs = np.asarray(gq.quantize(x.reshape(-1, 32 * 8), gguf.GGMLQuantizationType(int(t)))).reshape(-1)
        assert np.array_equal(ours, theirs), f"{t.name} {label}: {np.flatnonzero(ours != theirs)[:8]}"


@pytest.mark.parametrize("t", REF_TYPES, ids=lambda t: t.name)
def test_reference_quantizer_error_bound(t, rng):
    x = rng.standard_normal(32 * 128).astype(np.float32)
    y = dequantize(quantize(x, t), t)
    blocks = x.reshape(-1, 32)
    span = blocks.max(1) - blocks.min(1)
    amax = np.abs(blocks).max(1)
    # half a quantization step (plus f16 rounding of the scale) per block; the
    # symmetric types put the largest |x| at -8 (or -16) steps, so the opposite
    # extreme clips to +7 (+15) steps: one full step there.
    half_steps = {T.Q4_0: amax / 8, T.Q5_0: amax / 16, T.Q8_0: amax / 127 / 2, T.Q4_1: span / 30, T.Q5_1: span / 62}[t]
    err = np.abs(y - x).reshape(-1, 32).max(1)
    assert np.all(err <= half_steps * 1.01 + amax * 2 ** -10), t.name


@pytest.mark.parametrize("t,n", [(T.Q8_0, 32 * 48), (T.Q8_1, 32 * 48), (T.Q8_K, 256 * 6)], ids=["Q8_0", "Q8_1", "Q8_K"])
def test_activation_quantizer_round_trip(t, n, rng):
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))).astype(np.float32)
    raw = quantize_act(x, t)
    vals, d, s = parse_act(t, raw, n)
    bs = n // len(d)
    blocks = x.reshape(-1, bs).astype(np.float64)
    amax = np.abs(blocks).max(1)
    # d = amax/127 (rounded to f16 for Q8_0/Q8_1, f32 for Q8_K), q = round(x/d), |q| <= 127
    assert np.allclose(d, amax / 127, rtol=2 ** -10 if t != T.Q8_K else 1e-6)
    q = np.round(vals.reshape(-1, bs) / np.where(d == 0, 1, d)[:, None])
    assert np.abs(q).max() <= 127
    err = np.abs(vals.reshape(-1, bs) - blocks)
    # half a step, plus the scale's f16 rounding carried over 127 steps
    bound = d * 0.5 + amax * (2 ** -11 if t != T.Q8_K else 2 ** -23) + 1e-30
    assert np.all(err <= bound[:, None] * 1.0001)
    # the C++ dequantizer agrees with the independent parse
    assert np.allclose(dequantize(raw, t), vals, rtol=0, atol=0)
    if t == T.Q8_1:  # s = d * sum(q), rounded to f16
        sums = (vals.reshape(-1, bs) / np.where(d == 0, 1, d)[:, None]).sum(1)
        assert np.allclose(s, d * sums, rtol=2 ** -10, atol=0)


SIMD_ISAS = [i for i in available_isas() if i != "scalar"]


@pytest.mark.skipif(not SIMD_ISAS, reason="this build and CPU have no SIMD activation quantizer")
@pytest.mark.parametrize("t", [T.Q8_0, T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_simd_activation_quantizer_matches_reference(t, rng):
    """The GEMM quantizes activations with its ISA's quantizer: the reference's bytes exactly
    (scales, quants, Q8_1 sums, Q8_K block sums), ties at k + 1/2 included."""
    cases = list(inputs(rng))
    ties = (rng.integers(-254, 255, 32 * 64) / 2).astype(np.float32)
    ties[::32] = 127.0  # every block's max is 127, so d = 1 and each odd half-integer is a tie
    cases.append(("ties", ties))
    cases.append(("tiny", (rng.standard_normal(32 * 64) * 1e-30).astype(np.float32)))
    for isa in SIMD_ISAS:
        for label, x in cases:
            assert np.array_equal(quantize_act(x, t, isa), quantize_act(x, t)), (isa, label)


@pytest.mark.parametrize("isa", available_isas())
def test_activation_quantizer_rejects_what_it_cannot_make(isa):
    import minfer
    x = np.ones(256, np.float32)
    with pytest.raises(minfer.MinferError, match="Q4_K is not an activation type"):
        quantize_act(x, T.Q4_K, isa)
    with pytest.raises(minfer.MinferError, match="not a multiple of the Q8_0 block size 32"):
        quantize_act(x[:40], T.Q8_0, isa)


def test_q8_0_activation_equals_weight_quantizer(rng):
    x = rng.standard_normal(32 * 16).astype(np.float32)
    assert np.array_equal(quantize_act(x, T.Q8_0), quantize(x, T.Q8_0))


def test_quantize_rejects_partial_block():
    import minfer
    with pytest.raises(minfer.MinferError, match="not a multiple of the Q4_0 block size 32"):
        quantize(np.zeros(33, np.float32), T.Q4_0)
