"""Rung 1 for dequantization: every type equals the `gguf` package bit for bit,
on random blocks and on real tensors of the real models."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the PyPI `gguf` package is the independent oracle")
from gguf import quants as gq  # noqa: E402

import minfer  # noqa: E402
from minfer.quants import GGMLType as T, WEIGHT_TYPES, dequantize, type_info  # noqa: E402


def oracle(raw: np.ndarray, t: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gq.dequantize(raw, gguf.GGMLQuantizationType(int(t))), dtype=np.float32).reshape(-1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_random_blocks_bit_exact(t, rng):
    # Raw random bytes: every bit pattern, inf/nan scales included.
    _, bs, ts, _ = type_info(t)
    raw = rng.integers(0, 256, size=(300, ts), dtype=np.uint8)
    if t == T.F32:
        raw = raw.reshape(-1, 4)  # gguf views F32 as float32 rows
    ours = dequantize(raw, t)
    assert ours.size == raw.size // ts * bs
    assert same_bits(ours, oracle(raw, t))


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_random_values_bit_exact(t, rng):
    # Sane scales and realistic magnitudes (the common case, not only garbage).
    from quant_helpers import random_weight_row

    raw = random_weight_row(rng, t, 4096)
    assert same_bits(dequantize(raw, t), oracle(raw.reshape(-1, type_info(t)[2]), t))


def _check_real(path, max_per_type=3):
    f = minfer.gguf.open(path)
    seen = {}
    for name, info in f.tensors.items():
        if seen.get(info.type, 0) >= max_per_type:
            continue
        seen[info.type] = seen.get(info.type, 0) + 1
        data = info.data
        rows = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
        rows = rows[:256]  # enough rows to cover every code path, fast
        raw = rows.view(np.uint8)
        assert same_bits(dequantize(raw, info.type), oracle(np.ascontiguousarray(raw), info.type)), name
    return seen


def test_real_tensors_smollm2(smollm2_path):
    seen = _check_real(smollm2_path)
    assert {T.Q4_1, T.Q8_0, T.F32} <= set(seen)


def test_real_tensors_qwen05(qwen05_path):
    seen = _check_real(qwen05_path)
    assert {T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F32} <= set(seen)


def test_bad_length_raises():
    with pytest.raises(minfer.MinferError, match="not a whole number of Q4_K blocks"):
        dequantize(np.zeros(145, np.uint8), T.Q4_K)
