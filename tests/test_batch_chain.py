"""Chains of greedy batch steps (BatchRunner.step_greedy_chain; the engine's decode of greedy sequences): the
same tokens, and the same KV rows, as the steps run one by one; every step's rows checked before the first
runs; on CUDA the chain runs on the device (each step's argmax feeding the next step's token, position and KV
slot); the engine's chains give the tokens of its single steps, a sequence that ends midway included."""
import numpy as np
import pytest

import minfer
from conftest import require_cuda, synthetic_model
from minfer import _minfer
from minfer.batch import Engine

TINY = "qwen2-tiny-q8_0"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def prompted_runner(device, prompts, block_size=16):
    """A runner whose sequences have read their prompts (one step), over shuffled blocks with room for 40
    tokens more each; returns (runner, tables, each sequence's first decode token)."""
    if device == "cuda":
        require_cuda()
    model = _minfer.Model(str(synthetic_model(TINY)))
    runner = _minfer.BatchRunner(model, n_ctx=128, threads=2, kv_tokens=1024, block_size=block_size, device=device)
    perm = np.random.default_rng(3).permutation(runner.n_blocks)
    tables = np.zeros((len(prompts), runner.max_blocks), np.int32)
    for s, p in enumerate(prompts):
        nb = -(-(len(p) + 40) // block_size)
        tables[s, :nb] = perm[s * 8:s * 8 + nb]
    lens = np.array([len(p) for p in prompts], np.int32)
    first = runner.step_greedy(np.concatenate(prompts).astype(np.int32),
                               np.concatenate([np.arange(n) for n in lens]).astype(np.int32), lens, tables)
    return runner, tables, first


@pytest.mark.parametrize("device", DEVICES)
def test_a_chain_gives_the_tokens_and_kv_of_single_steps(device, rng):
    """Three ragged sequences, 13 greedy steps crossing block boundaries (blocks of 16): the chain's tokens are
    the ones of 13 single steps, and a step after either reads equal KV (its logits are the same bits)."""
    prompts = [rng.integers(0, 150000, size=n) for n in (5, 17, 30)]
    start = np.array([len(p) for p in prompts], np.int32)
    steps = 13
    a, tables, first = prompted_runner(device, prompts)
    chained = a.step_greedy_chain(first, start, tables, steps)
    b, _, first_b = prompted_runner(device, prompts)
    assert np.array_equal(first, first_b)
    single, tok = [], first_b
    for i in range(steps):
        tok = b.step_greedy(tok, start + i, np.ones(3, np.int32), tables)
        single.append(tok)
    assert chained.shape == (steps, 3) and np.array_equal(chained, np.array(single))
    ones = np.ones(3, np.int32)
    after = [r.step(chained[-1].copy(), start + steps, ones, tables) for r in (a, b)]
    assert np.array_equal(after[0], after[1])
    assert a.chains == (device == "cuda") and a.chained_steps == (steps if device == "cuda" else 0)
    assert b.chained_steps == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_chain_checks_every_step_before_the_first(device, rng):
    """A block missing for a later step of the chain, a position past the context or no steps: an error naming
    it before any step runs -- the K/V rows its first steps would write keep what they held (a step reading
    them gives the logits it gave before)."""
    prompts = [rng.integers(0, 150000, size=n) for n in (14, 3)]
    runner, tables, first = prompted_runner(device, prompts)
    a, b, c = (int(t) for t in (first[0] + 1) % 150000 + np.arange(3))
    one = tables[:1]
    runner.step(np.array([a, b], np.int32), np.array([14, 15], np.int32), np.array([2], np.int32), one)  # rows 14, 15
    before = runner.step(np.array([c], np.int32), np.array([16], np.int32), np.array([1], np.int32), one)
    start = np.array([14, 3], np.int32)
    short = tables.copy()
    short[0, 1:] = -1  # sequence 0 has only its first block: positions 14 and 15 fit, 16 does not
    with pytest.raises(minfer.MinferError, match="sequence 0's block 1 is -1"):
        runner.step_greedy_chain(first, start, short, 3)
    with pytest.raises(minfer.MinferError, match="outside the context of 128"):
        runner.step_greedy_chain(first, np.array([100, 3], np.int32), tables, 40)
    with pytest.raises(minfer.MinferError, match="0 steps"):
        runner.step_greedy_chain(first, start, tables, 0)
    with pytest.raises(ValueError, match="tables must be"):
        runner.step_greedy_chain(first, start, tables[:1], 2)
    after = runner.step(np.array([c], np.int32), np.array([16], np.int32), np.array([1], np.int32), one)
    assert np.array_equal(after, before)
    assert runner.step_greedy_chain(first, start, short, 2).shape == (2, 2)  # the steps that fit run


@pytest.fixture(scope="module")
def tiny_path():
    return str(synthetic_model(TINY))


def run_engine(path, prompts, each, chain, device, max_sequences=4):
    """Each request's Completion, and the length of each chain the engine ran."""
    with Engine(path, n_ctx=256, threads=2, max_sequences=max_sequences, block_size=16, backend=device) as eng:
        eng._chain_steps = chain  # (the device decides it; on the CPU a chain's steps run one by one)
        chains = []
        run_chain = eng._run_chain
        eng._run_chain = lambda *a: chains.append(a[-1]) or run_chain(*a)
        res = [h.result(timeout=300) for h in [eng.submit(p, **k) for p, k in zip(prompts, each)]]
        assert eng.running == 0 and eng.pool.n_free == eng.pool.n_blocks and all(c == 0 for c in eng.pool.refs)
        return res, chains


@pytest.mark.parametrize("device", DEVICES)
def test_engine_chains_give_the_tokens_of_single_steps(tiny_path, device, rng):
    """Greedy requests of different lengths, one ending at a stop string midway through a chain, one at its
    token count (not a multiple of the chain), one sampled (no chain while it runs): the engine with chains of 5
    gives each the tokens, text and stop reason the engine stepping one by one gives, in fewer turns; every
    block comes back."""
    if device == "cuda":
        require_cuda()
    prompts = [list(map(int, rng.integers(0, 150000, size=n))) for n in (3, 20, 9, 31)]
    each = [dict(max_tokens=23), dict(max_tokens=40), dict(max_tokens=17), dict(max_tokens=30)]
    text = run_engine(tiny_path, prompts, each, 1, device)[0][1].text
    each[1] = dict(max_tokens=40, stop=[text[len(text) // 2:len(text) // 2 + 3]])  # met midway
    single, none = run_engine(tiny_path, prompts, each, 1, device)
    assert single[1].metrics.stop_reason == "stop" and len(single[1].tokens) < 40 and not none
    chained, chains = run_engine(tiny_path, prompts, each, 5, device)
    for s, c in zip(single, chained):
        assert (c.tokens, c.text, c.metrics.stop_reason) == (s.tokens, s.text, s.metrics.stop_reason)
    assert chains and max(chains) == 5
    sampled = [dict(max_tokens=12), dict(max_tokens=12, temperature=0.8, seed=4), dict(max_tokens=12),
               dict(max_tokens=12)]
    a, _ = run_engine(tiny_path, prompts, sampled, 1, device)
    b, _ = run_engine(tiny_path, prompts, sampled, 5, device)
    assert [o.tokens for o in a] == [o.tokens for o in b]


def test_engine_chains_while_requests_wait_for_a_slot(tiny_path, rng):
    """Six greedy requests through two slots: the four that wait for a slot do not stop the running pair's
    chains (a chain ends where the first of them makes its last token), and every request gets the tokens of
    the engine stepping one by one."""
    prompts = [list(map(int, rng.integers(0, 150000, size=n))) for n in (4, 11, 7, 2, 9, 5)]
    each = [dict(max_tokens=n) for n in (14, 9, 21, 6, 12, 17)]
    single, _ = run_engine(tiny_path, prompts, each, 1, "cpu", max_sequences=2)
    chained, chains = run_engine(tiny_path, prompts, each, 8, "cpu", max_sequences=2)
    assert [c.tokens for c in chained] == [s.tokens for s in single]
    assert len(chains) >= 4 and max(chains) == 8
