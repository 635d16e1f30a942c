"""Sliding-window layers in the batch engine: their KV in a pool of their own (BatchRunner local_tokens,
minfer.kv_blocks.WindowPool) where a sequence holds only its window's blocks.  On the tiny gemma3 (window 16,
five local layers of six): the batch step's logits are bit-identical to the one pool's and (CPU) to the
sequence run alone (the session keeps rings), with the table entries before each window -1 (never read);
the engine's greedy tokens equal one-at-a-time generation through prompts far longer than the window, with
prefix caching and preemption; every block comes back."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minfer
from minfer import _minfer
from minfer.batch import Engine
from conftest import require_cuda

HERE = Path(__file__).parent
WINDOW = 16


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    out = tmp_path_factory.mktemp("window") / "gemma3-q8_0.gguf"
    subprocess.run([sys.executable, str(HERE / "tiny_models.py"), "gemma3-q8_0", str(out)], check=True)
    return str(out)


@pytest.fixture(scope="module")
def alone(gemma):
    with minfer.LLM(gemma, n_ctx=1024, threads=2) as llm:
        yield llm


def prompts(n, rng, lo, hi):
    return [[1] + list(map(int, rng.integers(3, 512, size=int(rng.integers(lo, hi))))) for _ in range(n)]


def drive(runner, ids, s, window_pool):
    """One sequence's rows through the runner in steps of 40 rows, then of one: its global layers' blocks at
    20 s.., its sliding-window blocks cycling through eight of its own (8 s..), the entries before each step's
    first window -1 (never read).  Returns each step's last row's logits."""
    bs, pieces = 16, [(a, min(a + 40, len(ids) - 8)) for a in range(0, len(ids) - 8, 40)]
    pieces += [(a, a + 1) for a in range(len(ids) - 8, len(ids))]
    tables = np.zeros((1, runner.max_blocks), np.int32)
    tables[0, :-(-len(ids) // bs)] = np.arange(-(-len(ids) // bs)) + 20 * s
    local = np.full((1, runner.max_blocks), -1, np.int32)
    out = []
    for a, b in pieces:
        first = max(0, a - WINDOW) // bs  # WindowPool.first_kept
        local[0, :first] = -1
        for k in range(first, (b - 1) // bs + 1):
            local[0, k] = k % 8 + 8 * s
        args = (np.asarray(ids[a:b], np.int32), np.arange(a, b, dtype=np.int32), np.array([b - a], np.int32), tables)
        logits = runner.step(*args, local.copy() if window_pool else None)
        out.append(logits[0])
    return np.array(out)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_batch_step_over_the_window_pool_equals_the_one_pool(gemma, rng, device):
    """The same steps with the sliding-window layers in a pool of their own and in the one pool: the same
    bits (the same kernels and arithmetic, other rows); on the CPU also those of the sequence alone."""
    if device == "cuda":
        require_cuda()
    model = _minfer.Model(gemma)

    def runner(local_tokens):
        return _minfer.BatchRunner(model, n_ctx=1024, threads=2, kv_tokens=4096, block_size=16, device=device,
                                   local_tokens=local_tokens)
    own, one = runner(512), runner(0)
    assert own.n_local_blocks == 32 and one.n_local_blocks == 0 and own.n_blocks == 256
    for s, ids in enumerate(prompts(3, rng, 90, 250)):
        got = drive(own, ids, s, True)
        assert np.array_equal(got, drive(one, ids, s, False)), s
        if device == "cpu":
            want = _minfer.Session(model, n_ctx=1024, threads=2).eval(np.asarray(ids, np.int32), 0, True)
            ends = [min(a + 40, len(ids) - 8) - 1 for a in range(0, len(ids) - 8, 40)] + list(range(len(ids) - 8, len(ids)))
            assert np.array_equal(got, want[ends]), s
    t = np.full((1, own.max_blocks), -1, np.int32)
    t[0, 0] = 0  # position 20's window starts in block 0 and ends in block 1, which is missing
    step = (np.array([5], np.int32), np.array([20], np.int32), np.array([1], np.int32), np.zeros_like(t))
    with pytest.raises(minfer.MinferError, match="sliding-window pool is -1"):
        own.step(*step, t)
    with pytest.raises(minfer.MinferError, match="give their block tables"):
        own.step(*step)


def test_the_engine_holds_windows_not_contexts(gemma, alone, rng):
    """Prompts of 40-400 tokens (25 windows), four at a time, 30 greedy tokens each: the tokens of each
    alone; the sliding-window pool is 24 blocks of 16 against 512 for the others."""
    ps = prompts(6, rng, 40, 400)
    expected = [alone.generate(p, max_tokens=30).tokens for p in ps]
    with Engine(gemma, n_ctx=1024, threads=2, max_sequences=4, block_size=16, step_tokens=64) as eng:
        assert eng.window_pool is not None and eng.window_pool.n_blocks == 4 * (1 + 4) + 4
        outs = eng.generate_batch(ps, max_tokens=30)
        assert eng.pool.n_free == eng.pool.n_blocks and eng.window_pool.n_free == eng.window_pool.n_blocks
    assert [o.tokens for o in outs] == expected


def test_prefix_caching_and_preemption_with_a_window_pool(gemma, alone, rng):
    system = prompts(1, rng, 100, 101)[0]
    tails = [p[1:] for p in prompts(4, rng, 3, 10)]
    with Engine(gemma, n_ctx=1024, threads=2, max_sequences=4, block_size=16, step_tokens=64) as eng:
        first = eng.submit(system + tails[0], max_tokens=8).result()
        rest = [h.result() for h in [eng.submit(system + t, max_tokens=8) for t in tails[1:]]]
    assert first.metrics.cached_tokens == 0 and all(r.metrics.cached_tokens == 96 for r in rest)
    assert [r.tokens for r in [first] + rest] == [alone.generate(system + t, max_tokens=8).tokens for t in tails]

    ps = prompts(4, rng, 60, 80)
    expected = [alone.generate(p, max_tokens=60).tokens for p in ps]
    with Engine(gemma, n_ctx=1024, threads=2, max_sequences=4, kv_tokens=400, block_size=16, step_tokens=64) as eng:
        assert eng.window_pool is not None
        outs = eng.generate_batch(ps, max_tokens=60)
        assert eng.preemptions > 0
        assert eng.pool.n_free == eng.pool.n_blocks and eng.window_pool.n_free == eng.window_pool.n_blocks
    assert [o.tokens for o in outs] == expected


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_greedy_chain_over_a_window_pool_runs_its_steps_one_by_one(gemma, rng, device):
    """With a sliding-window pool of its own (whose blocks the engine gives back as a sequence moves on) a
    chain of greedy steps is never a device chain: its steps run one by one, giving single steps' tokens."""
    if device == "cuda":
        require_cuda()
    model = _minfer.Model(gemma)
    ids = prompts(1, rng, 40, 41)[0][:40]

    def prompted():
        r = _minfer.BatchRunner(model, n_ctx=1024, threads=2, kv_tokens=4096, block_size=16, device=device,
                                local_tokens=512)
        local = np.full((1, r.max_blocks), -1, np.int32)
        local[0, :4] = [5, 7, 9, 11]
        t = np.zeros((1, r.max_blocks), np.int32)
        t[0, :4] = [3, 1, 2, 0]
        first = r.step_greedy(np.asarray(ids, np.int32), np.arange(40, dtype=np.int32), np.array([40], np.int32), t,
                              local)
        return r, t, local, first
    a, t, local, first = prompted()
    assert not a.chains
    chained = a.step_greedy_chain(first, np.array([40], np.int32), t, 10, local)
    b, _, _, tok = prompted()
    single = []
    for i in range(10):
        tok = b.step_greedy(tok, np.array([40 + i], np.int32), np.ones(1, np.int32), t, local)
        single.append(tok)
    assert np.array_equal(chained, np.array(single)) and a.chained_steps == 0

