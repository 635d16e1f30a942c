"""One step of the batch engine (minfer.batch.Engine, which runs its loop): which rows the step takes (a
decode token a sequence, drafts, prompt chunks under the step's token budget), running them on the
BatchRunner (greedy rows read their argmax, sampled rows their top-k or their logits; greedy sequences with
nothing else to do run chains of steps), and taking each sequence's new token (streamed, or its end)."""
from __future__ import annotations

import time

import numpy as np

from . import _minfer, constrain
from .request import Request

# Greedy steps a chain runs at most: a GPU's host turn (~0.3-0.5 ms) is paid once for them, and a stream's
# tokens come in bursts of as many (vLLM's multi-step scheduling makes the same trade).
CHAIN_STEPS = 8


class Steps:
    """The engine's step, as methods of the Engine (they read its pool, tables, runner and requests)."""

    def _plan_step(self) -> list[tuple[Request, int]]:
        """(request, tokens it feeds) for this step: one per decoding sequence, then prompt chunks.  Each loop
        here runs once a sequence a step: the common case (a decode row, room in its last block, no draft) is
        the first branch taken."""
        decoding, reading = [], []  # reading: a prompt (or a preempted sequence's tokens) still to be read
        for r in self._running:
            r.decoding = r.n_kv == len(r.all_tokens) - 1 and bool(r.tokens)
            (decoding if r.decoding else reading).append(r)
        pool = self.pool
        for r in decoding:  # room for the token each will write: preempt the newest when out of blocks
            if r.blocks is None:  # preempted by an earlier one of these
                continue
            toks = r.all_tokens
            if r.blocks.n_tokens >= len(toks) or pool.extend_in_place(r.blocks):  # the usual case: room in its block
                continue
            while r.blocks.n_tokens < len(toks) and not pool.can_append(r.blocks):
                if self._preempt() is r:
                    break
            if r.blocks is not None and r.blocks.n_tokens < len(toks):
                table = r.blocks.table
                n_table = len(table)
                copy = pool.append(r.blocks, toks)
                if copy is not None:
                    self._runner.copy_block(*copy)
                if copy is not None or len(table) != n_table:  # a new last block
                    self._tables[r.slot, len(table) - 1] = table[-1]
        batch = [(r, 1) for r in decoding if r.blocks is not None]
        budget = self.step_tokens - len(batch)
        asks = []  # (request, tokens) to ask the draft model for
        if not self._judge.resting():
            for i, (r, _) in enumerate(batch):  # drafts go in the room left in the sequence's own last block
                if r.lookup is None and r.draft_policy is None:  # (r.draft stays empty: only this loop fills it)
                    continue
                r.draft = []
                room = min(len(r.blocks.table) * pool.block_size - r.blocks.n_tokens, budget,
                           r.max_tokens - r.metrics.generated_tokens - 1, self.n_ctx - len(r.all_tokens) - 1)
                if room <= 0 or pool.refs[r.blocks.table[-1]] != 1:
                    continue
                if r.lookup is not None:
                    r.draft, r.draft_from = r.lookup.propose(room), r.lookup.policy
                if not r.draft and r.draft_policy is not None and (k := r.draft_policy.limit(room)) > 0:
                    asks.append((i, k))
                    continue
                if r.draft:
                    batch[i] = (r, 1 + len(r.draft))
                    budget -= len(r.draft)
        self._draft_s = 0.0
        if asks and budget > 0:
            t0 = time.perf_counter()
            drafts = self._draft.propose([(batch[i][0], min(k, budget)) for i, k in asks])
            self._draft_s = time.perf_counter() - t0
            for (i, _), d in zip(asks, drafts):
                r = batch[i][0]
                if d and budget > 0:
                    r.draft, r.draft_from = d[:budget], r.draft_policy
                    batch[i] = (r, 1 + len(r.draft))
                    budget -= len(r.draft)
        for r in reading:
            if budget <= 0:
                break
            left = len(r.all_tokens) - r.n_kv
            if left <= 0 or r.blocks is None:
                continue
            n = min(left, budget)
            batch.append((r, n))
            budget -= n
        if self.window_pool is not None:
            self._window_rows(batch)
        return batch

    def _run_step(self, batch: list[tuple[Request, int]]) -> None:
        runner = self._runner
        # A sequence with a draft runs as 1 + k one-row sequences over its one block table, at consecutive
        # positions: every row's K/V is stored before any row attends, so each row sees the ones before it,
        # and the step returns (or picks from) every row's logits.
        if all(n == 1 and r.decoding and r.plain for r, n in batch):  # one decode row a sequence: most steps
            reqs = [r for r, _ in batch]
            positions = [r.n_kv for r in reqs]
            tokens = [r.all_tokens[k] for r, k in zip(reqs, positions)]
            slots = [r.slot for r in reqs]
            if self._chain_steps > 1 and (k := self._chain_length(reqs)) > 1:
                return self._run_chain(reqs, tokens, positions, slots, k)
            lens = self._ones[:len(reqs)]
            first = owner = rows = range(len(reqs))
            spec, constrained, decode_only = (), (), True
            greedy, best = all(r.greedy for r in reqs), 0
            if not greedy:  # the most best logits a row needs (-1: one needs its whole row)
                ks = [r.best_k for r in reqs]
                best = max(ks) if min(ks) > 0 else -1
        else:
            tokens, positions, lens, slots, owner = [], [], [], [], []
            first = []  # batch index -> its first row of the step's output
            rows = []  # rows that sample: a decode row, or a prompt's last chunk
            spec = set()  # batch indices of sequences with a draft
            constrained = []  # (matcher, row) of the rows that sample under a constraint
            greedy = decode_only = True  # every sampling row greedy without logprobs; every sequence decoding
            best = 0  # the most best logits a sampling row needs, while each needs no more (-1: one needs its row)
            for i, (r, n) in enumerate(batch):
                first.append(len(owner))
                if r.decoding or r.n_kv + n == len(r.all_tokens):
                    rows.append(len(owner))
                    greedy = greedy and r.greedy and r.logprobs is None
                    best = max(best, r.best_k) if best >= 0 and r.best_k > 0 else -1
                    if r.matcher is not None:
                        constrained.append((r.matcher, len(owner)))
                decode_only = decode_only and r.decoding
                if r.decoding and r.draft:
                    spec.add(i)
                    for j, t in enumerate([r.all_tokens[r.n_kv]] + r.draft):
                        tokens.append(t)
                        positions.append(r.n_kv + j)
                        lens.append(1)
                        slots.append(r.slot)
                        owner.append(i)
                    continue
                if n == 1:  # a decode row (most rows of most steps)
                    tokens.append(r.all_tokens[r.n_kv])
                    positions.append(r.n_kv)
                else:
                    tokens.extend(r.all_tokens[r.n_kv:r.n_kv + n])
                    positions.extend(range(r.n_kv, r.n_kv + n))
                lens.append(n)
                slots.append(r.slot)
                owner.append(i)
        tables = self._tables[slots]  # entries past a sequence's last block are ignored
        window_tables = None if self.window_pool is None else self._window_tables[slots]
        args = (np.array(tokens, np.int32), np.array(positions, np.int32), np.asarray(lens, np.int32), tables,
                window_tables)
        lps: dict[int, tuple] = {}
        logits = None
        masks = (lambda: self._fill_masks(constrained, len(owner))) if constrained else None
        t0 = time.perf_counter()
        if greedy:
            picked = runner.step_greedy(*args, allow=masks)  # the masks are computed while the step runs
        elif 0 < best <= runner.best_max and not spec:  # each row's top-k crosses, not its whole vocabulary
            vals, ids = runner.step_best(*args, k=best)
            samplers = [batch[owner[k]][0].sampler for k in rows]
            if len(rows) == len(owner):  # every row samples (a decode step)
                picked = _minfer.sample_best_rows(samplers, vals, ids)
            else:
                picked = np.zeros(len(owner), np.int32)
                picked[rows] = _minfer.sample_best_rows(samplers, vals[rows], ids[rows])
        else:
            if self._logits is None:
                self._logits = runner.logits_buffer(self.max_sequences)
            logits = runner.step(*args, out=self._logits if len(owner) <= self.max_sequences else None)
            picked = np.zeros(len(owner), np.int32)
            plain = [k for k in rows if not batch[owner[k]][0].draft]
            every = len(plain) == len(owner)  # (a decode step's rows are all plain: no copy of the logits)
            allow = (masks() if every else masks()[plain]) if masks else None
            picked[plain] = _minfer.sample_rows([batch[owner[k]][0].sampler for k in plain],
                                                logits if every else logits[plain], allow)
            for k in plain:
                r = batch[owner[k]][0]
                if r.logprobs is not None:
                    lps[k] = _logprobs(logits[k], int(picked[k]), r.logprobs)
        self.steps += 1
        step_s = time.perf_counter() - t0
        if not spec and decode_only:  # a plain decode step
            self._judge.plain_step(step_s, len(batch))
        step_s += self._draft_s
        judged = bool(spec) and decode_only and self._judge.plain_s is not None  # does this step's speculation pay?
        n_before = sum(r.metrics.generated_tokens for r, _ in batch) if judged else 0
        picked = picked.tolist()
        block_size = self.pool.block_size
        for i, (r, n) in enumerate(batch):
            k = first[i]
            if i in spec:
                self._check_draft(r, picked[k:k + n], None if logits is None else logits[k:k + n], step_s)
                continue
            r.n_kv += n
            if r.window_blocks is not None or r.n_kv >= (len(r.blocks.hashes) + 1) * block_size:  # (per token)
                self._written(r)
            if r.n_kv == len(r.all_tokens):
                if lps and k in lps and picked[k] not in r.eog:  # an end-of-generation token is no output token
                    r.token_logprobs.append(lps[k])
                self._take(r, picked[k])
        made = sum(r.metrics.generated_tokens for r, _ in batch) - n_before if judged else 0
        if judged and self._judge.spec_step(step_s, made, bool(self._draft_s)):  # the draft model does not pay
            for r in self._running:
                r.draft_policy = None
                self._draft.release(r.kv_draft)
                r.kv_draft = None

    def _chain_length(self, reqs: list[Request]) -> int:
        """How many greedy steps the sequences of a decode step can run as one chain (1: none): every one greedy
        with nothing else to do between steps (no draft, no constraint, no logprobs), none cancelled, no request
        waiting that a free slot could take (one waiting for a slot waits for a sequence to end, and a chain
        never runs past a sequence's last token), each with that many tokens still to make and the pool blocks
        for them."""
        if (self._waiting and len(self._running) < self.max_sequences) or self._cancelled or \
                self.window_pool is not None:
            return 1
        k = self._chain_steps
        for r in reqs:
            if not r.greedy or r.lookup is not None or r.draft_policy is not None:
                return 1
            k = min(k, r.end - len(r.all_tokens))
        if k > 1:  # the blocks of positions n_kv + 1 .. n_kv + k - 1, past the one this step writes
            pool = self.pool
            need = sum(pool.blocks_for(r.blocks.n_tokens + k - 1) - len(r.blocks.table) for r in reqs)
            if need > pool.n_free:
                return 1
        return k

    def _run_chain(self, reqs: list[Request], tokens: list[int], positions: list[int], slots: list[int],
                   k: int) -> None:
        """k greedy decode steps in one call (BatchRunner.step_greedy_chain: on a GPU one wait, not k), their
        tokens then taken step by step as k plain steps would take them: a sequence that ends midway drops the
        rest (the K/V rows it wrote past its end lie in its own blocks, freed with it)."""
        for r in reqs:
            table = r.blocks.table
            n_table = len(table)
            if self.pool.reserve(r.blocks, k - 1):
                self._tables[r.slot, n_table:len(table)] = table[n_table:]
        t0 = time.perf_counter()
        picked = self._runner.step_greedy_chain(np.array(tokens, np.int32), np.array(positions, np.int32),
                                                self._tables[slots], k)
        self._judge.plain_step((time.perf_counter() - t0) / k, len(reqs))
        self.steps += k
        block_size = self.pool.block_size
        for row in picked.tolist():
            for r, tok in zip(reqs, row):
                if r.blocks is None or r._cancel.is_set():  # ended earlier in the chain, or cancelled meanwhile
                    continue
                r.n_kv += 1
                if r.n_kv >= (len(r.blocks.hashes) + 1) * block_size:
                    self._written(r)
                self._take(r, tok)

    def _fill_masks(self, constrained: list, rows: int) -> np.ndarray:
        """[rows, words] token masks: each constrained row's from its matcher, every token allowed elsewhere."""
        if self._masks is None:
            self._masks = constrain.executor()
        out = np.full((rows, constrained[0][0].words), -1, np.int32)
        constrain.fill_masks(self._masks, constrained, out)
        return out

    def _check_draft(self, r: Request, picked: list[int], logits, seconds: float) -> None:
        """A sequence's rows [last token, d1..dk]: its drafts kept in turn while the sampler agrees (greedy: the
        row's argmax, else Sampler.verify), then the sampler's own token; each taken as it is decided, so the
        penalty window and a stop see every token before the next."""
        draft, policy = r.draft, r.draft_from
        r.draft = []
        n_sequence = r.n_kv + 1  # the tokens before the draft
        r.n_kv += 1  # the last token's K/V
        kept = 0
        for j in range(len(draft) + 1):
            if j < len(draft):
                tok = picked[j] if logits is None else r.sampler.verify(logits[j], draft[j], None)
            else:
                tok = picked[j] if logits is None else r.sampler.sample(logits[j])
            if j < len(draft) and tok == draft[j]:
                kept += 1
            self._take(r, tok)
            if r.blocks is None or j == len(draft) or tok != draft[j]:
                break
            r.n_kv += 1  # a kept draft token's K/V was computed in this step
            r.blocks.n_tokens += 1
        if self._judge.plain_s is not None:
            policy.plain_step(self._judge.plain_s)
        policy.verified(len(draft), kept, seconds)
        if policy is r.draft_policy and r.kv_draft is not None:
            self._draft.checked(r, n_sequence, kept)
        r.metrics.drafted_tokens += len(draft)
        r.metrics.accepted_tokens += kept
        if r.blocks is not None:
            self._written(r)

    def _take(self, r: Request, tok: int) -> None:
        """A sequence's next token: streamed, or the end of it."""
        if r.t_first is None:
            m = r.metrics
            r.t_first = time.perf_counter()
            m.ttft_s = r.t_first - r.t_submit
            m.prefill_tps = (m.prompt_tokens - m.cached_tokens) / max(r.t_first - r.t_admit, 1e-9)
        if tok in r.eog:
            reason = "stop"
        else:
            if r.keeps_history:
                r.sampler.accept(tok)
            r.tokens.append(tok)
            r.all_tokens.append(tok)
            r.metrics.generated_tokens += 1
            if r.lookup is not None:
                r.lookup.extend([tok])
            reason = None
            if r._engine_text:
                r._send(r.text.push(tok))
                if r.text.hit:  # a stop string
                    reason = "stop"
            else:
                r._pieces.put(tok)
            if r.matcher is not None:
                try:
                    r.matcher.consume(tok)
                except Exception as e:  # this sequence fails; the others go on
                    self._running.remove(r)
                    self._release(r)
                    r._finish("error", e)
                    return
                if r.matcher.done:  # the grammar is complete
                    reason = "stop"
            if reason is None:
                if len(r.all_tokens) < r.end:
                    return
                reason = "length" if len(r.tokens) >= r.max_tokens else "context"
        self._running.remove(r)
        self._release(r)
        r._finish(reason)


def _logprobs(logits: np.ndarray, tok: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The model's log-probability of `tok` (a log-softmax of the raw logits, before any sampling setting) and
    the k likeliest tokens with theirs, likeliest first."""
    x = logits.astype(np.float64)
    lse = float(x.max() + np.log(np.exp(x - x.max()).sum()))
    top = np.argpartition(-x, k)[:k] if k else np.zeros(0, np.int64)
    top = top[np.argsort(-x[top], kind="stable")]
    return float(x[tok] - lse), [(int(t), float(x[t] - lse)) for t in top]
