"""The paged KV cache's bookkeeping (minfer.kv_blocks): block tables under allocation, prefix sharing,
copy-on-write, freeing and preemption, and a long random run whose every step is checked against the
invariants the kernels rely on."""
from __future__ import annotations

import numpy as np
import pytest

from minfer.kv_blocks import BlockPool, WindowPool


def test_a_sequence_gets_the_blocks_its_tokens_need():
    pool = BlockPool(8, 4)
    seq, hit = pool.allocate(list(range(10)))
    assert hit == 0 and len(seq.table) == 3 and len(set(seq.table)) == 3 and pool.n_free == 5
    for t in range(10, 13):  # fills the third block's last two slots, then opens a fourth
        assert pool.append(seq, list(range(t + 1))) is None
    assert len(seq.table) == 4 and seq.n_tokens == 13
    pool.free(seq)
    assert pool.n_free == 8 and all(r == 0 for r in pool.refs)


def test_a_common_prefix_shares_its_full_blocks():
    """A second request with the same system prompt takes the cached blocks of every full block of it but
    the one that holds its last token (which must be computed for logits); its own tokens get fresh blocks."""
    pool = BlockPool(16, 4)
    system = list(range(100, 112))  # three full blocks
    a, hit_a = pool.allocate(system + [1, 2, 3])
    early, hit = pool.allocate(system + [7, 8])  # a's prefill has not run: nothing to share yet
    assert hit == 0 and not set(early.table) & set(a.table)
    pool.free(early)
    pool.written(a, system + [1, 2, 3], 15)
    b, hit_b = pool.allocate(system + [7, 8])
    assert hit_a == 0 and hit_b == 12
    assert b.table[:3] == a.table[:3] and b.table[3] != a.table[3]
    assert [pool.refs[x] for x in a.table[:3]] == [2, 2, 2]
    same, hit = pool.allocate(system)  # the whole prompt cached: its last block is still computed
    assert hit == 8 and same.table[:2] == a.table[:2] and same.table[2] != a.table[2]
    other, hit = pool.allocate([5] + system[1:])  # a different first token: the chain differs everywhere
    assert hit == 0 and not set(other.table) & set(a.table)


def test_freed_prefix_blocks_stay_cached_until_needed():
    pool = BlockPool(6, 4)
    prompt = list(range(9))
    a, _ = pool.allocate(prompt)
    pool.written(a, prompt, 9)
    first = list(a.table)
    pool.free(a)
    b, hit = pool.allocate(prompt)  # nothing else asked for blocks: the content is still there
    assert hit == 8 and b.table[:2] == first[:2]
    pool.free(b)
    pool.written(b, prompt, 9)
    filler, _ = pool.allocate(list(range(1000, 1021)))  # 6 blocks: every cached one is evicted
    assert len(filler.table) == 6
    pool.free(filler)
    c, hit = pool.allocate(prompt)
    assert hit == 0


def test_copy_on_write_of_a_shared_partial_block():
    pool = BlockPool(8, 4)
    tokens = list(range(6))
    a, _ = pool.allocate(tokens)
    b = pool.fork(a)
    assert b.table == a.table and pool.refs[a.table[1]] == 2
    copy = pool.append(b, tokens + [50])  # b writes into the shared second block: copied first
    assert copy == (a.table[1], b.table[1]) and b.table[1] != a.table[1]
    assert pool.refs[a.table[1]] == 1 and pool.refs[b.table[0]] == 2  # the full first block stays shared
    assert pool.append(a, tokens + [60]) is None  # a's block is its own again: written in place
    pool.free(a)
    pool.free(b)
    assert all(r == 0 for r in pool.refs) and pool.n_free == 8


def test_truncate_drops_a_drafts_rows_and_blocks():
    """A draft's rows past what the target kept: truncate gives back the blocks past the kept tokens, keeps
    the findable full blocks, and refuses to cut into one (its next write would change a cached block)."""
    pool = BlockPool(8, 4)
    toks = list(range(6))
    seq, _ = pool.allocate(toks)
    for t in range(6, 13):  # seven draft rows: into a fourth block
        pool.append(seq, list(range(t + 1)))
    assert len(seq.table) == 4 and pool.n_free == 4
    pool.written(seq, list(range(13)), 4)  # the first block's tokens are kept and findable
    pool.truncate(seq, 7)
    assert seq.n_tokens == 7 and len(seq.table) == 2 and pool.n_free == 6
    pool.append(seq, list(range(8)))  # grows again from there
    assert seq.n_tokens == 8 and len(seq.table) == 2
    with pytest.raises(ValueError, match="findable"):
        pool.truncate(seq, 3)
    with pytest.raises(ValueError):
        pool.truncate(seq, 9)
    pool.free(seq)
    assert pool.n_free == 8 and all(r == 0 for r in pool.refs)


def test_extend_in_place_is_appends_usual_case():
    """extend_in_place counts a token into the sequence's own last block and refuses (changing nothing) where
    append would open a block or copy a shared one."""
    pool = BlockPool(8, 4)
    a, _ = pool.allocate(list(range(6)))
    assert pool.extend_in_place(a) and a.n_tokens == 7 and len(a.table) == 2
    assert pool.extend_in_place(a) and a.n_tokens == 8
    assert not pool.extend_in_place(a) and a.n_tokens == 8  # the block is full: a new one is append's
    assert pool.append(a, list(range(9))) is None and len(a.table) == 3
    b = pool.fork(a)
    assert not pool.extend_in_place(b) and b.n_tokens == 9 and b.table == a.table  # shared: append copies
    pool.free(a)
    pool.free(b)
    assert all(r == 0 for r in pool.refs)


def test_reserve_takes_the_blocks_of_tokens_ahead():
    """reserve counts n tokens in at once (a chain of greedy steps), the sequence's own last block first, then
    fresh blocks; it refuses a shared last block and more blocks than are free, changing nothing."""
    pool = BlockPool(6, 4)
    a, _ = pool.allocate(list(range(6)))
    assert pool.reserve(a, 1) == [] and a.n_tokens == 7 and len(a.table) == 2
    new = pool.reserve(a, 6)  # 13 tokens: two more blocks
    assert len(new) == 2 and a.table[2:] == new and a.n_tokens == 13 and all(pool.refs[b] == 1 for b in new)
    assert len(set(a.table)) == 4 and pool.n_free == 2
    with pytest.raises(RuntimeError, match="need 3 blocks, 2 are free"):
        pool.reserve(a, 12)
    assert a.n_tokens == 13 and len(a.table) == 4
    b = pool.fork(a)  # its last block shared: append must copy it before anything is written past it
    with pytest.raises(ValueError, match="shared"):
        pool.reserve(b, 1)
    pool.free(a)
    pool.free(b)
    assert all(r == 0 for r in pool.refs) and pool.n_free == 6


def test_out_of_blocks_is_said_before_it_happens():
    pool = BlockPool(3, 4)
    a, _ = pool.allocate(list(range(8)))
    assert not pool.can_allocate(list(range(100, 106))) and pool.can_allocate([1])
    with pytest.raises(RuntimeError, match="need more blocks"):
        pool.allocate(list(range(100, 106)))
    b, _ = pool.allocate([1, 2, 3, 4])
    assert not pool.can_append(a)
    with pytest.raises(RuntimeError, match="no free block"):
        pool.append(a, list(range(9)))
    pool.free(b)  # preempting b makes room for a
    assert pool.can_append(a) and pool.append(a, list(range(9))) is None
    with pytest.raises(ValueError):
        pool.append(a, list(range(5)))
    with pytest.raises(ValueError):
        BlockPool(0, 16)


def test_random_requests_never_lose_a_block():
    """1,000 requests of random lengths and arrivals over a small pool, with shared prefixes, forks,
    preemption when blocks run out, and completion or cancellation at random steps.  After every step:
    each block's count equals the tables holding it, no block is both free and held, every table covers its
    tokens, and two sequences share a block only where their tokens agree up to its end.  At the end every
    block is back."""
    rng = np.random.default_rng(7)
    pool = BlockPool(64, 8)
    prefixes = [list(rng.integers(0, 500, size=int(n))) for n in (16, 24, 40)]
    live: dict[int, tuple] = {}  # id -> (SeqBlocks, tokens, tokens still to generate)
    waiting, next_id, done = [], 0, 0

    def check():
        held = np.zeros(pool.n_blocks, int)
        owner: dict[int, list] = {}
        for seq, toks, _ in live.values():
            assert len(seq.table) == pool.blocks_for(seq.n_tokens) and seq.n_tokens == len(toks)
            for i, blk in enumerate(seq.table):
                held[blk] += 1
                end = min((i + 1) * pool.block_size, len(toks))
                if blk in owner:  # shared: the same tokens up to the end of the block
                    other = owner[blk]
                    assert other[:end] == toks[:end] or len(other) < end or len(toks) < end
                owner[blk] = toks
        assert list(held) == pool.refs
        assert pool.n_free == int((held == 0).sum())

    uid = 0
    for step in range(4000):
        if next_id < 1000 and rng.random() < 0.4:
            base = prefixes[int(rng.integers(0, 3))] if rng.random() < 0.6 else []
            waiting.append(base + list(rng.integers(0, 500, size=int(rng.integers(1, 30)))))
            next_id += 1
        while waiting and pool.can_allocate(waiting[0]):
            toks = waiting.pop(0)
            seq, hit = pool.allocate(toks)
            assert hit % pool.block_size == 0 and hit < len(toks)
            pool.written(seq, toks, len(toks))  # its prefill runs at once here
            uid += 1
            live[uid] = (seq, list(toks), int(rng.integers(1, 40)))
            if rng.random() < 0.05:
                uid += 1
                live[uid] = (pool.fork(seq), list(toks), int(rng.integers(1, 20)))
        for key in list(live):
            if key not in live:  # preempted earlier in this step
                continue
            seq, toks, left = live[key]
            if left == 0 or rng.random() < 0.01:  # finished or cancelled
                pool.free(seq)
                del live[key]
                done += 1
                continue
            while not pool.can_append(seq):  # preempt the newest sequence: its tokens wait for blocks again
                victim = max(live)
                vseq, vtoks, _ = live.pop(victim)
                pool.free(vseq)
                waiting.insert(0, vtoks)
                if victim == key:
                    break
            if key not in live:
                continue
            toks.append(int(rng.integers(0, 500)))
            pool.append(seq, toks)
            pool.written(seq, toks, len(toks))
            live[key] = (seq, toks, left - 1)
        check()
        if next_id >= 1000 and not live and not waiting:
            break
    assert next_id == 1000 and not live and not waiting
    assert all(r == 0 for r in pool.refs) and pool.n_free == pool.n_blocks


# ---- the sliding-window layers' pool ---------------------------------------------------------------------

def grow(pool, seq, toks, end):
    """Rows up to `end` written, as the engine does: blocks first, then the rows' KV counted in."""
    copies = pool.ensure(seq, seq.n_tokens, end)
    pool.written(seq, toks, end)
    return copies


def test_a_window_pool_keeps_only_the_window():
    """Window 6, blocks of 4: once 10 rows are written, rows at 10 and later read keys 5.. (block 1 on),
    so block 0 goes back (findable still); a sequence never holds more than window / 4 + 2 blocks."""
    pool = WindowPool(8, 4, window=6)
    toks = list(range(100, 160))
    seq, hit = pool.allocate(toks[:11])
    assert hit == 0 and seq.table == [] and seq.n_tokens == 0  # blocks come with the rows
    grow(pool, seq, toks, 10)
    assert seq.table[0] == -1 and seq.released == 1 and len(seq.table) == 3
    assert pool.n_free == 8 - 2  # the released block is cached, so it counts as free
    for n in range(11, 60):
        grow(pool, seq, toks, n)
        held = [b for b in seq.table if b >= 0]
        assert len(held) <= 6 // 4 + 2 and all(b == -1 for b in seq.table[:pool.first_kept(n)])
    pool.free(seq)
    assert pool.n_free == pool.n_blocks and all(r == 0 for r in pool.refs)


def test_a_window_pool_finds_a_prefix_by_its_window():
    """A prefix is cached when the blocks its window reads are: evicting its first block does not lose a
    16-token prefix whose window (6) starts in block 2, but does lose the 4-token one."""
    pool = WindowPool(6, 4, window=6)
    toks = list(range(200, 217))
    seq, _ = pool.allocate(toks)
    grow(pool, seq, toks, 16)
    pool.free(seq)
    assert pool.cached_prefix(toks) == 16
    assert pool.cached_prefix(toks, limit=9) == 8
    first = pool._by_hash[seq_hash(toks, 1)]
    other = pool.allocate(list(range(300, 330)))[0]
    while first in pool._cached:  # take blocks until the least recently freed (the first) is evicted
        pool.ensure(other, other.n_tokens, other.n_tokens + 4)
    assert pool.cached_prefix(toks) == 16 and pool.cached_prefix(toks[:5]) == 0
    pool.free(other)
    again, hit = pool.allocate(toks)
    assert hit == 16 and again.table[:2] == [-1, -1] and again.released == 2
    assert all(b >= 0 for b in again.table[2:4])


def seq_hash(toks, n_blocks, bs=4):
    from minfer.kv_blocks import chain_hash
    h = b""
    for i in range(n_blocks):
        h = chain_hash(h, toks[i * bs:(i + 1) * bs])
    return h


def test_a_window_pool_copies_a_shared_block_before_writing():
    pool = WindowPool(8, 4, window=6)
    toks = list(range(50, 70))
    seq, _ = pool.allocate(toks)
    grow(pool, seq, toks, 6)
    twin = pool.fork(seq)
    copies = pool.ensure(twin, 6, 7)
    assert len(copies) == 1 and copies[0][0] == seq.table[1] and twin.table[1] == copies[0][1]
    assert pool.ensure(seq, 6, 7) == []  # the original is no longer shared
    with pytest.raises(ValueError, match="rows"):
        pool.ensure(seq, 9, 10)  # a gap
    pool.free(seq)
    pool.free(twin)
    assert pool.n_free == pool.n_blocks
