"""Microbenchmarks of the CPU matrix products (pytest-benchmark).

    pytest benchmarks/bench_matmul.py --benchmark-json=out.json
    python benchmarks/summarize.py out.json      # Markdown tables
    pytest benchmarks/bench_matmul.py --threads 1   # threads (default: all physical cores)

Matrix-vector: every weight type x ISA at the shapes of qwen2.5-coder-1.5b
(rows x cols: 1536x1536 attention, 8960x1536 ffn_up/gate, 1536x8960 ffn_down,
151936x1536 output), reported as GB/s of weight bytes streamed.  Matrix-matrix:
512 tokens, reported as GFLOP/s (2 * rows * cols * tokens).
"""
import numpy as np
import pytest

from minfer import quants as q
from minfer.quants import GGMLType as T

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.BF16, T.F32]
SHAPES = [(1536, 1536), (8960, 1536), (1536, 8960), (151936, 1536)]
_cache = {}


def weights(t, rows, cols):
    key = (t, rows, cols)
    if key not in _cache:
        _cache.clear()  # one matrix at a time: the vocab-sized ones are large
        from quant_helpers import random_weight_row

        rng = np.random.default_rng(0)
        row = random_weight_row(rng, t, cols)
        # distinct random rows are not needed for timing; a tiled row with varied bytes streams the same
        w = np.tile(row, (rows, 1))
        w ^= rng.integers(0, 2, size=w.shape, dtype=np.uint8) if t not in (T.F16, T.BF16, T.F32) else 0
        if t not in (T.F16, T.BF16, T.F32):
            from quant_helpers import F16_FIELDS
            ts = q.type_info(t)[2]
            w3 = w.reshape(rows, -1, ts)
            for off in F16_FIELDS[t]:
                w3[:, :, off:off + 2] = row.reshape(-1, ts)[None, :, off:off + 2]
        _cache[key] = w
    return _cache[key]


@pytest.fixture(scope="module")
def pool(request):
    return q.ThreadPool(request.config.getoption("--threads") or q.physical_cores())


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matvec(benchmark, pool, t, shape, isa):
    if isa not in q.available_isas():
        pytest.skip(f"{isa} not available here")
    if isa == "scalar" and shape[0] > 10000:
        pytest.skip("scalar at vocab size is too slow to be interesting")
    rows, cols = shape
    w = weights(t, rows, cols)
    x = np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32)
    out = np.empty((1, rows), np.float32)
    benchmark.pedantic(q.matmul, args=(w, t, x), kwargs=dict(pool=pool, isa=isa, out=out),
                       rounds=20 if rows < 100000 else 5, warmup_rounds=2)
    sec = benchmark.stats.stats.median
    benchmark.extra_info.update(kind="matvec", type=t.name, isa=isa, rows=rows, cols=cols, threads=pool.size,
                                weight_bytes=int(w.nbytes), gbps=w.nbytes / sec / 1e9)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: t.name)
def test_matmul_512(benchmark, pool, t, shape, isa):
    if isa not in q.available_isas():
        pytest.skip(f"{isa} not available here")
    rows, cols = shape
    w = weights(t, rows, cols)
    x = np.random.default_rng(1).standard_normal((512, cols)).astype(np.float32)
    out = np.empty((512, rows), np.float32)
    benchmark.pedantic(q.matmul, args=(w, t, x), kwargs=dict(pool=pool, isa=isa, out=out), rounds=3, warmup_rounds=1)
    sec = benchmark.stats.stats.median
    benchmark.extra_info.update(kind="matmul512", type=t.name, isa=isa, rows=rows, cols=cols, threads=pool.size,
                                gflops=2 * rows * cols * 512 / sec / 1e9)
