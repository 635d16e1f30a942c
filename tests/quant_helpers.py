"""Independent numpy views of block layouts used by the quant tests: random valid
blocks for each weight type, and parsers of the activation blocks."""
from __future__ import annotations

import numpy as np

from minfer.quants import GGMLType as T, type_info

# Byte offsets of the f16 scale fields of each block type (they must be finite
# and of a realistic size for dot-product tests; dequantization tests use raw
# random bytes instead).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0],
}
# The f16 "min" fields (x = d*q + m or - dmin*m): their term is kept apart in error bounds.
MIN_FIELDS = {T.Q4_1: 2, T.Q5_1: 2, T.Q2_K: 82, T.Q4_K: 2, T.Q5_K: 2}


def random_weight_row(rng, t: int, n: int) -> np.ndarray:
    """Bytes of one row of n values of weight type t, with sane scales."""
    if t == T.F32:
        return rng.standard_normal(n).astype(np.float32).view(np.uint8)
    if t == T.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8)
    if t == T.BF16:
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    _, bs, ts, _ = type_info(t)
    nb = n // bs
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        scale = (rng.uniform(0.5, 2.0, nb) * 2.0 ** -7).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def with_min_zeroed(t: int, row: np.ndarray, keep: str) -> np.ndarray:
    """A copy of the row with either the scale part ('min' kept) or the min part ('scale' kept) zeroed."""
    _, bs, ts, _ = type_info(t)
    r = row.copy().reshape(-1, ts)
    if keep == "scale":
        r[:, MIN_FIELDS[t]:MIN_FIELDS[t] + 2] = 0
    else:
        for off in F16_FIELDS[t]:
            if off != MIN_FIELDS[t]:
                r[:, off:off + 2] = 0
    return r.reshape(-1)


def parse_act(t: int, raw: np.ndarray, n: int):
    """(values, per-block d, per-block s or None) of an activation row, parsed in numpy."""
    if t == T.F32:
        return raw.view(np.float32).astype(np.float64), None, None
    if t == T.Q8_0:
        b = raw.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float64)[:, 0]
        q = b[:, 2:].view(np.int8).astype(np.float64)
        return _f32_product(q, d), d, None
    if t == T.Q8_1:
        b = raw.reshape(-1, 36)
        d = b[:, :2].copy().view(np.float16).astype(np.float64)[:, 0]
        s = b[:, 2:4].copy().view(np.float16).astype(np.float64)[:, 0]
        q = b[:, 4:].view(np.int8).astype(np.float64)
        return _f32_product(q, d), d, s
    if t == T.Q8_K:
        b = raw.reshape(-1, 292)
        d = b[:, :4].copy().view(np.float32).astype(np.float64)[:, 0]
        q = b[:, 4:260].view(np.int8).astype(np.int64)
        bsums = b[:, 260:].copy().view(np.int16).astype(np.int64)
        assert np.array_equal(bsums, q.reshape(-1, 16, 16).sum(-1)), "Q8_K bsums are not the sums of 16 quants"
        return _f32_product(q, d), d, None
    raise ValueError(t)


def _f32_product(q, d):
    # the value a kernel sees: the f32 product of the quant and the (f16 or f32) scale
    return (q.astype(np.float32) * d.astype(np.float32)[:, None]).reshape(-1).astype(np.float64)
