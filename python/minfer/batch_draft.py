"""A draft model for the batch engine (minfer.batch): every decoding sequence's draft in a few shared steps.

The draft has its own runner and KV pool (minfer.kv_blocks), and each sequence its own blocks in it and a
count of how many of its tokens the draft's cache holds.  To draft k tokens for every sequence at once: one
step evaluates each sequence's tokens that the draft's cache lacks (after a check: the replacement token, or
the last kept draft tokens; at first the prompt), then k - 1 one-token steps; each step's argmax is found
where the logits are.  Drafts are greedy, so the target checks them as point masses (Sampler.verify without a
q): exact for greedy and for sampled requests alike.  After the check the draft's cache keeps what the target
kept (KvDraft.checked); its rows past that are dropped with their blocks.
"""
from __future__ import annotations

import os

import numpy as np

from . import _minfer, draft
from .kv_blocks import BlockPool, SeqBlocks


class KvDraft:
    """A sequence's state in the draft: its blocks, its row of the draft's block tables, the tokens whose K/V
    the draft's cache holds (a prefix of the sequence), and the draft tokens evaluated past them."""

    def __init__(self, blocks: SeqBlocks, slot: int, n_kv: int):
        self.blocks, self.slot, self.n_kv = blocks, slot, n_kv
        self.evaluated = 0  # draft tokens of the last proposal whose K/V the draft computed


class BatchDraft:
    def __init__(self, model: str | os.PathLike, target_tokenizer, target_name: str, n_ctx: int,
                 threads: int | None, backend: str, kv_type: str, kv_tokens: int, block_size: int,
                 max_sequences: int):
        _, m = draft.load(model, target_tokenizer, target_name)
        self.runner = _minfer.BatchRunner(m, n_ctx=n_ctx, threads=threads or 0, kv_type=kv_type,
                                          device="" if backend == "auto" else backend, kv_tokens=kv_tokens,
                                          block_size=block_size)
        self.runner.prepare(max_sequences)
        self.pool = BlockPool(self.runner.n_blocks, self.runner.block_size)
        self.tables = np.zeros((max_sequences, self.runner.max_blocks), np.int32)
        self.slots = list(range(max_sequences - 1, -1, -1))
        self.steps = 0

    def checked(self, r, n_sequence: int, kept: int) -> None:
        """The target kept `kept` tokens of the sequence's last draft, proposed after its first n_sequence."""
        st = r.kv_draft
        st.n_kv = n_sequence + min(kept, st.evaluated)
        st.evaluated = 0
        if st.n_kv >= (len(st.blocks.hashes) + 1) * self.pool.block_size:  # full blocks: findable now
            self.pool.written(st.blocks, r.all_tokens, st.n_kv)

    def release(self, state: KvDraft | None) -> None:
        if state is not None:
            self.pool.free(state.blocks)
            self.slots.append(state.slot)

    def _room(self, r, k: int) -> int:
        """Blocks for the sequence's tokens and k - 1 draft tokens in the draft's pool; how many it got."""
        toks = r.all_tokens
        st = r.kv_draft
        if st is None:
            if not self.slots or not self.pool.can_allocate(toks):
                return 0
            blocks, hit = self.pool.allocate(toks)
            st = r.kv_draft = KvDraft(blocks, self.slots.pop(), hit)
        elif st.blocks.n_tokens > st.n_kv:  # rows of draft tokens the target did not keep
            self.pool.truncate(st.blocks, st.n_kv)
        want = len(toks) + k - 1
        pad = toks + [0] * k  # append() reads only the list's length
        while st.blocks.n_tokens < want and self.pool.can_append(st.blocks):
            copy = self.pool.append(st.blocks, pad[:st.blocks.n_tokens + 1])
            if copy is not None:
                self.runner.copy_block(*copy)
        self.tables[st.slot, :len(st.blocks.table)] = st.blocks.table
        if st.blocks.n_tokens < len(toks):
            return 0
        return min(k, st.blocks.n_tokens - len(toks) + 1)

    def propose(self, asks: list[tuple[object, int]]) -> list[list[int]]:
        """Drafts of up to k tokens for each (request, k), in order ([] where the draft's pool has no room)."""
        out = [[] for _ in asks]
        todo = []
        for j, (r, k) in enumerate(asks):
            k = self._room(r, k)
            if k > 0:
                todo.append((r, k, out[j]))
        if not todo:
            return out
        # the tokens each sequence's draft cache lacks, in one step
        tokens, positions, lens = [], [], []
        for r, _, _ in todo:
            st, toks = r.kv_draft, r.all_tokens
            tokens.extend(toks[st.n_kv:])
            positions.extend(range(st.n_kv, len(toks)))
            lens.append(len(toks) - st.n_kv)
        slots = [r.kv_draft.slot for r, _, _ in todo]
        picked = self.runner.step_greedy(np.asarray(tokens, np.int32), np.asarray(positions, np.int32),
                                         np.asarray(lens, np.int32), self.tables[slots]).tolist()
        self.steps += 1
        for (r, _, d), t in zip(todo, picked):
            r.kv_draft.n_kv = len(r.all_tokens)
            d.append(t)
        # then one token a step for the sequences still drafting
        for i in range(1, max(k for _, k, _ in todo)):
            live = [(r, d) for r, k, d in todo if k > i]
            picked = self.runner.step_greedy(
                np.asarray([d[-1] for _, d in live], np.int32),
                np.asarray([len(r.all_tokens) + i - 1 for r, _ in live], np.int32),
                np.ones(len(live), np.int32), self.tables[[r.kv_draft.slot for r, _ in live]]).tolist()
            self.steps += 1
            for (r, d), t in zip(live, picked):
                d.append(t)
                r.kv_draft.evaluated = i
        return out
