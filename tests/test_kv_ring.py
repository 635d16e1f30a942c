"""Local layers' KV rings (ModelConfig::kv_ring): a sliding-window layer keeps its window plus one step's rows
(kRingStep = 512), position p in row p % ring, where the whole context would not be smaller.  On the tiny
gemma3 (window 16: rings of 544 rows) with prompts far past the ring: the logits agree with an exact float64
forward, do not depend on how the prompt is cut into steps (bit for bit: a row's arithmetic depends only
on its position and its keys), rewinding within 512 positions gives the same bits, further is a clear error,
and the cache takes the memory of the rings."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minfer
from conftest import require_cuda
from tiny_models import gemma3_forward_f64, llama_f32

M = minfer._minfer
HERE = Path(__file__).parent
RING, STEP, KV_ROW = 544, 512, 2 * 64 * 2  # rows of a ring; kRingStep; bytes of a cache row (2 KV heads of 64, f16)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    out = tmp_path_factory.mktemp("ring") / "gemma3-q8_0.gguf"
    subprocess.run([sys.executable, str(HERE / "tiny_models.py"), "gemma3-q8_0", str(out)], check=True)
    return out


def prompt(n, seed=5):
    rng = np.random.default_rng(seed)
    return np.array([1] + list(rng.integers(3, 512, n - 1)), np.int32)


def session(path, n_ctx=2048, device="cpu"):
    return M.Session(M.Model(str(path)), n_ctx=n_ctx, threads=2, device=device)


def test_rings_take_their_window_plus_a_step(gemma, tmp_path):
    s = session(gemma)
    s.eval(prompt(700), 0, False)
    assert s.kv_bytes == 2 * KV_ROW * (5 * RING + 1 * 2048)  # five local layers in rings, the global one whole
    small = session(gemma, n_ctx=RING)  # a ring would not be smaller than the context: none
    small.eval(prompt(100), 0, False)
    assert small.kv_bytes == 2 * KV_ROW * 6 * RING and small.rewind_floor == 0
    llama = tmp_path / "llama.gguf"  # no local layers, no rings
    llama_f32(str(llama))
    s = session(llama)
    s.eval(prompt(700), 0, False)
    assert s.kv_bytes == 2 * KV_ROW * 2 * 2048 and s.rewind_floor == 0


def test_long_prompt_matches_float64(gemma):
    """1300 positions: every local layer's ring has wrapped twice.  Bound: the tiny-model fixtures' (twice the
    spread between llama.cpp and the float64 forward); reading a stale ring row moves logits by far more
    (a missing window: max 3)."""
    ids = prompt(1300)
    ours = session(gemma).eval(ids, 0, True)
    ref = gemma3_forward_f64(str(gemma), ids)
    assert np.abs(ours - ref).max() <= 0.15 and np.abs(ours - ref).mean() <= 0.025
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.9


@pytest.mark.gpu
def test_cuda_rings_match_float64(gemma):
    """The CUDA kernels on rings: a prompt cut into steps (the prefill kernels write and read wrapped rows),
    then 20 single-row decode steps (the split decode kernel, whose splits cross the ring's seam), against
    the float64 forward over all 1320 positions; the bound as on the CPU."""
    require_cuda()
    ids = prompt(1320, seed=8)
    s = session(gemma, device="cuda")
    pieces = [(0, 100), (100, 550), (550, 1300)] + [(i, i + 1) for i in range(1300, 1320)]
    ours = np.concatenate([s.eval(ids[i:j], i, True) for i, j in pieces])
    assert s.kv_bytes == 2 * KV_ROW * (5 * RING + 1 * 2048) and s.rewind_floor == 1320 - STEP
    ref = gemma3_forward_f64(str(gemma), ids)
    assert np.abs(ours - ref).max() <= 0.15 and np.abs(ours - ref).mean() <= 0.025
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.9


def test_steps_do_not_change_the_bits(gemma):
    ids = prompt(1300, seed=6)
    whole = session(gemma)
    a = whole.eval(ids, 0, True)  # pieces of 512 inside
    cut = session(gemma)
    b = np.concatenate([cut.eval(ids[i:j], i, True) for i, j in [(0, 100), (100, 550), (550, 1299), (1299, 1300)]])
    assert np.array_equal(a, b)
    tok = int(a[-1].argmax())
    for k in range(20):  # decode past the end, one row at a time
        x, y = whole.eval(np.array([tok], np.int32), 1300 + k, False), cut.eval(np.array([tok], np.int32), 1300 + k, False)
        assert np.array_equal(x, y)
        tok = int(x[0].argmax())


def test_rewinds_within_a_step_and_no_further(gemma):
    ids = prompt(1300, seed=7)
    s = session(gemma)
    first = s.eval(ids, 0, True)
    assert s.rewind_floor == 1300 - STEP
    again = s.eval(ids[1000:], 1000, True)  # back 300 positions: the rings still hold what it reads
    assert np.array_equal(again, first[1000:])
    with pytest.raises(minfer.MinferError, match="keep their last 512 positions in a ring.*at 0 or at 788 or later"):
        s.eval(ids[700:], 700, True)
    assert np.array_equal(s.eval(ids[:50], 0, True), first[:50])  # a new sequence from 0 is always possible


def test_reusable_prefix_respects_the_floor():
    from minfer.generation import reusable_prefix

    cached = list(range(1000))
    assert reusable_prefix(cached, cached[:900] + [7], floor=488) == 900
    assert reusable_prefix(cached, cached[:400] + [7], floor=488) == 0  # recomputed from the start
    assert reusable_prefix(cached, cached[:400] + [7]) == 400
