"""Many sequences at once: continuous batching over a paged KV cache.

    from minfer.batch import Engine
    with Engine("qwen2.5-coder-0.5b", threads=2, max_sequences=16) as eng:
        handle = eng.submit("def fib(n):", max_tokens=64, temperature=0.7, seed=1)
        for piece in handle:                       # streams as the tokens come
            print(piece, end="", flush=True)
        outs = eng.generate_batch(["a", "b", "c"], max_tokens=32)   # an offline job: Completions in order

One thread, the engine's, runs steps; submit(), the handles and cancel() may be used from any thread.  A
step takes one token from every sequence that is decoding and, in the budget of `step_tokens` left, chunks
of the prompts still to be read, so a long prompt never stalls the streams already running.  New requests
join at the next step; finished and cancelled ones leave at once.  Each sequence's KV lives in blocks of
one pool (minfer.kv_blocks): a prompt that begins like an earlier one reuses its computed blocks, and when
the pool runs out the newest sequence is preempted (its blocks freed, its tokens recomputed when blocks are
free again: the same tokens come out).  On the CPU a sequence's greedy tokens do not depend on what else is
in the batch: every kernel computes each row the same way at any batch size.  The step itself (which rows,
running them, taking their tokens; chains of greedy steps on a GPU) is minfer.batch_steps.

Text is made where it is read: a request without stop strings streams token ids to its reader, whose thread
turns them into text, so the engine's step does no per-token text work for it; stop strings need the text
in the engine (a stop ends the sequence), so those requests are detokenized there.
"""
from __future__ import annotations

import collections
import os
import threading
import time
import warnings
from typing import Sequence

import numpy as np

from . import _minfer, chat as chat_mod, constrain, engine, gguf, hub, tokenizer as tokenizer_mod
from .generation import Completion, ContextLengthError, check_request, make_sampler
from .batch_draft import BatchDraft
from .batch_steps import CHAIN_STEPS, Steps
from .kv_blocks import BlockPool, WindowPool
from .request import Request
from .speculative import MAX_DRAFT, DraftLength, StepJudge
from .stops import StopText

class Engine(Steps):
    """Continuous batching over one model: up to `max_sequences` sequences per step, their KV in a pool of
    `kv_tokens` tokens (default: max_sequences full contexts, at most 65,536 tokens) in blocks of
    `block_size`; a step reads at most `step_tokens` tokens.  A model's sliding-window layers (Gemma 3's
    local ones) keep their KV in a pool of their own, where each sequence holds only its window's blocks,
    where that pool is the smaller."""

    def __init__(self, model: str | engine.Model = hub.DEFAULT_MODEL, n_ctx: int | None = None,
                 threads: int | None = None, backend: str = "cpu", kv_type: str = "f16", max_sequences: int = 16,
                 kv_tokens: int | None = None, block_size: int = 32, step_tokens: int = 512, tokenizer=None,
                 draft_model: str | None = None, draft_max: int = MAX_DRAFT):
        if max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
        if step_tokens < max_sequences:
            raise ValueError(f"step_tokens ({step_tokens}) must be at least max_sequences ({max_sequences})")
        if isinstance(model, engine.Model):
            raise TypeError("Engine takes a model name or path (it reads the tokenizer from the file)")
        path = engine.resolve(model)
        if tokenizer is None:
            with gguf.open(path) as f:
                tokenizer = tokenizer_mod.from_gguf(f)
        self.tokenizer = tokenizer
        self._model = engine.Model(path)
        n_ctx = n_ctx or 0
        device = "" if backend == "auto" else backend
        if kv_tokens is None:
            per_seq = n_ctx or self._model.default_context(kv_type, device)
            n_ctx = per_seq
            kv_tokens = max(per_seq, min(max_sequences * per_seq, 1 << 16))
        window = self._model.config["sliding_window"]
        # every sequence's window (WindowPool: a block before it and the block being filled) and a step's rows
        window_tokens = (max_sequences * (-(-window // block_size) + 4) + -(-step_tokens // block_size)) * block_size
        self._runner = _minfer.BatchRunner(self._model, n_ctx=n_ctx, threads=threads or 0, kv_type=kv_type,
                                           device=device, kv_tokens=kv_tokens,
                                           block_size=block_size,
                                           local_tokens=window_tokens if window and window_tokens < kv_tokens else 0)
        self.n_ctx, self.n_vocab = self._runner.n_ctx, self._runner.n_vocab
        self._runner.prepare(max_sequences)  # every step shape's plan (and its memory) now, not over hours
        if self._runner.device != "cpu":  # visibly, not silently: which ops of a step leave the GPU
            on_cpu = sorted(op for op, where in self.placement().items() if "cpu" in where)
            if on_cpu:
                warnings.warn(f"{self._runner.device} batching: {', '.join(on_cpu)} run on the CPU (the GPU backend "
                              "does not support them here)", RuntimeWarning, stacklevel=2)
        self.max_sequences, self.step_tokens = max_sequences, step_tokens
        self._masks = None  # the constrained sequences' masks are computed on llguidance's threads (made at first use)
        self._logits = None  # where a sampled step's logits land (pinned host memory on CUDA), made at first use
        self._draft = None  # speculative decoding with a draft model for every sequence (minfer.batch_draft)
        self._draft_max = draft_max
        self._judge = StepJudge()  # whether speculation pays, engine-wide (each DraftLength judges its own too)
        self._draft_s = 0.0  # this step's draft-model seconds
        DraftLength(draft_max)  # ValueError for a bad one, before the load
        if draft_model is not None:
            self._draft = BatchDraft(draft_model, tokenizer, os.path.basename(path), self.n_ctx, threads, backend,
                                     kv_type, kv_tokens, block_size, max_sequences)
        self.pool = BlockPool(self._runner.n_blocks, self._runner.block_size)
        self.window_pool = (WindowPool(self._runner.n_local_blocks, block_size, window)
                            if self._runner.n_local_blocks else None)
        # each running sequence's block table in a row of its own (Request.slot), kept as its blocks change, so a
        # step gathers its tables in one indexing instead of a conversion a sequence
        self._tables = np.zeros((max_sequences, self._runner.max_blocks), np.int32)
        self._ones = np.ones(max_sequences, np.int32)  # a decode step's row counts
        # greedy decode steps run as one chain where the device chains them (the host's turn between steps hidden)
        self._chain_steps = CHAIN_STEPS if self._runner.chains else 1
        self._window_tables = np.full_like(self._tables, -1) if self.window_pool else None
        self._slots = list(range(max_sequences - 1, -1, -1))
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []   # admission order: the last is the newest (preempted first)
        self._cv = threading.Condition()
        self._closing = False
        self._cancelled = False  # some request was cancelled since the last turn looked
        self.steps = 0
        self.preemptions = 0
        # called on the engine's thread after each turn of its loop (a step, or requests finished without one):
        # an asynchronous reader (minfer.serve) wakes its handles there instead of a thread each
        self.on_turn: list = []
        self._thread = threading.Thread(target=self._loop, name="minfer-batch", daemon=True)
        self._thread.start()

    # -- the API ------------------------------------------------------------------------------------------
    def placement(self) -> dict[str, list[str]]:
        """Which backends run each op of a step: {op: [backend, ...]}."""
        return self._runner.placement()

    def submit(self, prompt: str | Sequence[int], max_tokens: int = 128, stop: Sequence[str] = (),
               parse_special: bool = False, logprobs: int | None = None, lookup: bool = False, draft: bool = True,
               **sampling) -> Request:
        """Queues a request; returns its handle at once.  Bad parameters and prompts that can never fit are
        errors here, before any work.  logprobs=k: each generated token's log-probability and the k likeliest
        tokens' (the handle's token_logprobs; such a sequence's steps return logits to the host).  lookup=True:
        speculative decoding with drafts from the text itself (minfer.lookup), checked in the sequence's rows
        of the batch step: the same tokens, or the same distribution, in fewer steps; with a draft model (the
        engine's draft_model), its drafts where lookup has none, unless draft=False.  A constraint
        (minfer.constrain: json_schema=, regex=, grammar= or choices=) masks each of the sequence's tokens; such
        a request does not speculate (its draft model is left out; lookup=True is an error)."""
        if lookup and logprobs is not None:
            raise ValueError("lookup=True does not take logprobs")
        constraint = constrain.pop_constraint(sampling)
        if constraint is not None and lookup:
            raise ValueError("lookup=True does not take a constraint in the batch engine")
        check_request(max_tokens, sampling)
        if logprobs is not None and not (isinstance(logprobs, int) and 0 <= logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in [0, 20], got {logprobs!r}")
        if isinstance(prompt, str):  # (parse_special: a chat, rendered by its template)
            ids = chat_mod.encode(self.tokenizer, prompt) if parse_special else self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if min(ids) < 0 or max(ids) >= self.n_vocab:
            raise ValueError(f"token ids must be in [0, {self.n_vocab}); got {min(ids)}..{max(ids)}")
        room = 1 if max_tokens else 0
        if len(ids) + room > self.n_ctx:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens; with {room} to generate it needs more "
                                     f"than the context of {self.n_ctx}")
        if self.pool.blocks_for(len(ids) + room) > self.pool.n_blocks:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens; the KV pool holds "
                                     f"{self.pool.n_blocks * self.pool.block_size}")
        matcher = None
        if constraint is not None:
            matcher = constraint.matcher(constrain.vocabulary(self.tokenizer, self.n_vocab))
        speculate = draft and self._draft is not None and logprobs is None and matcher is None
        req = Request(ids, max_tokens, make_sampler(self.n_vocab, sampling, ids), StopText(self.tokenizer, stop),
                      self.tokenizer.special.eog, logprobs, lookup, self._draft_max if speculate else 0, matcher)
        req._engine = self
        req.end = min(len(ids) + max_tokens, self.n_ctx)  # where its token count ends it
        if max_tokens == 0:
            req._finish("length")
            return req
        with self._cv:
            if self._closing:
                raise _minfer.MinferError("this engine is closed")
            self._waiting.append(req)
            self._cv.notify()
        return req

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_tokens: int = 128,
                       stop: Sequence[str] = (), **sampling) -> list[Completion]:
        """Every prompt's Completion, in order (all are submitted at once and batched)."""
        handles = [self.submit(p, max_tokens, stop, **sampling) for p in prompts]
        return [h.result() for h in handles]

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        """Cancels what is queued or running and stops the engine's thread."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the loop -----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closing and not self._waiting and not self._running:
                    self._cv.wait()
                if self._closing:
                    for r in list(self._running) + list(self._waiting):
                        self._release(r)
                        r._finish("cancelled")
                    self._running.clear()
                    self._waiting.clear()
                    for f in self.on_turn:
                        f()
                    return
            batch: list[tuple[Request, int]] = []
            try:
                self._drop_cancelled()
                self._admit()
                batch = self._plan_step()
                if batch:
                    self._run_step(batch)
            except Exception as e:  # the step's sequences fail with the error; the engine goes on
                for r, _ in batch or [(r, 0) for r in self._running]:
                    self._release(r)
                    if r in self._running:
                        self._running.remove(r)
                    r._finish("error", e)
            for f in self.on_turn:
                f()

    def _release(self, r: Request) -> None:
        if self._draft is not None:
            self._draft.release(r.kv_draft)
            r.kv_draft = None
        if r.blocks is not None:
            self.pool.free(r.blocks)
            r.blocks = None
            self._slots.append(r.slot)
        if r.window_blocks is not None:
            self.window_pool.free(r.window_blocks)
            r.window_blocks = None
        r.n_kv = 0

    def _drop_cancelled(self) -> None:
        if not self._cancelled:
            return
        self._cancelled = False  # before the scan: a cancel during it is seen now or on the next turn
        with self._cv:
            for r in [r for r in self._waiting if r._cancel.is_set()]:
                self._waiting.remove(r)
                r._finish("cancelled")
        for r in [r for r in self._running if r._cancel.is_set()]:
            self._running.remove(r)
            self._release(r)
            r._finish("cancelled")

    def _admit(self) -> None:
        """Waiting requests (preempted ones first) join while there is room for them."""
        while len(self._running) < self.max_sequences:
            with self._cv:
                if not self._waiting:
                    return
                r = self._waiting[0]
                hit = self._cached_prefix(r.all_tokens)
                if not (self.pool.can_allocate(r.all_tokens, hit) and
                        (self.window_pool is None or self.window_pool.can_allocate(r.all_tokens, hit))):
                    if self._running:
                        return  # it waits for blocks to come back
                    self._waiting.popleft()  # alone it still does not fit: the pool is its context
                    r._finish("context")
                    continue
                self._waiting.popleft()
            r.blocks, r.n_kv = self.pool.allocate(r.all_tokens, hit)
            r.slot = self._slots.pop()
            self._tables[r.slot, :len(r.blocks.table)] = r.blocks.table
            if self.window_pool is not None:
                r.window_blocks, _ = self.window_pool.allocate(r.all_tokens, hit)
                self._window_tables[r.slot] = -1
                self._window_tables[r.slot, :len(r.window_blocks.table)] = r.window_blocks.table
            if not r.admitted:
                r.metrics.cached_tokens = r.n_kv
                r.admitted = True
                r.t_admit = time.perf_counter()
            self._running.append(r)

    def _cached_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens every pool holds (the sliding-window one: their windows)."""
        hit = self.pool.cached_prefix(tokens)
        return hit if self.window_pool is None else self.window_pool.cached_prefix(tokens, hit)

    def _window_rows(self, batch: list[tuple[Request, int]]) -> None:
        """Blocks in the sliding-window pool for the rows each sequence writes this step."""
        wp, tables = self.window_pool, self._window_tables
        for r, n in batch:
            seq = r.window_blocks
            had = len(seq.table)
            for src, dst in wp.ensure(seq, r.n_kv, r.n_kv + n):  # (a copy of the block at r.n_kv)
                self._runner.copy_block(src, dst, local=True)
                tables[r.slot, r.n_kv // wp.block_size] = dst
            if len(seq.table) != had:
                tables[r.slot, had:len(seq.table)] = seq.table[had:]

    def _written(self, r: Request) -> None:
        """r.n_kv rows of the sequence are computed: full blocks become findable (and the sliding-window pool
        takes back the blocks before its window)."""
        if r.n_kv >= (len(r.blocks.hashes) + 1) * self.pool.block_size:
            self.pool.written(r.blocks, r.all_tokens, r.n_kv)
        w = r.window_blocks
        if w is not None and (r.n_kv >= (len(w.hashes) + 1) * self.pool.block_size or
                              self.window_pool.first_kept(r.n_kv) > w.released):
            self.window_pool.written(w, r.all_tokens, r.n_kv)

    def _preempt(self) -> Request:
        victim = self._running.pop()
        self._release(victim)
        self.preemptions += 1
        with self._cv:
            self._waiting.appendleft(victim)
        return victim
