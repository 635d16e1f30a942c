"""minfer.LLM: load a GGUF model and generate from Python.

    from minfer import LLM
    with LLM("qwen2.5-coder-0.5b", threads=2) as llm:
        out = llm.generate("def fib(n):", max_tokens=64, temperature=0.7, seed=1)
        print(out.text, out.metrics)
        for piece in llm.chat_stream([{"role": "user", "content": "Hi!"}]):
            print(piece, end="", flush=True)

The decode loop is Python over the native Session: one eval for the part of
the prompt that is not already in the KV cache (a follow-up chat turn reuses
the shared prefix), then one eval per token, each followed by the C++ sampler
(greedy sampling on CUDA: Session.decode_greedy, GREEDY_CHUNK steps at a time
with the argmax on the device, no logits read back).  Calls on one LLM are
serialized by a lock; `cancel()` from another thread stops the running
generation before its next token.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Iterable, Iterator, Sequence

import numpy as np

from . import _minfer, batch, chat as chat_mod, constrain, engine, gguf, hub, tokenizer
from .draft import DraftModel
from .generation import Completion, ContextLengthError, Metrics, check_request, make_sampler, reusable_prefix
from .lookup import PromptLookup
from .speculative import MAX_DRAFT, DraftLength, FirstOf, Verification
from .stops import StopText

log = logging.getLogger("minfer")
log.addHandler(logging.NullHandler())  # quiet unless the application configures logging


# Greedy sampling on a session whose decode steps chain on the device (Session.chains) takes its tokens
# GREEDY_CHUNK at a time (Session.decode_greedy): the argmax stays on the device and no logits come back; text
# still streams token by token, and the steps a chunk ran past a stop are dropped.  Elsewhere each step's
# logits go through the sampler.
GREEDY_CHUNK = 16


class LLM:
    """max_sequences > 1: calls from several threads run batched (minfer.batch.Engine: continuous batching
    over a paged KV cache) instead of one after another.  draft_model: a small model with the same vocabulary
    that drafts up to draft_max tokens per step for speculative decoding (minfer.draft; with max_sequences,
    minfer.batch_draft: greedy drafts for every sequence in shared steps); one sequence at a time, it stops
    where its top probability is below draft_p_min (default 0.5)."""

    def __init__(self, model: str | os.PathLike = hub.DEFAULT_MODEL, n_ctx: int | None = None,
                 threads: int | None = None, backend: str = "auto", kv_type: str = "f16", max_sequences: int = 1,
                 draft_model: str | os.PathLike | None = None, draft_max: int = MAX_DRAFT,
                 draft_p_min: float | None = None):
        if backend not in ("auto", "cpu", "cuda", "metal"):
            raise ValueError(f"backend must be 'auto', 'cpu', 'cuda' or 'metal', got {backend!r}")
        if max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
        if draft_p_min is not None and max_sequences > 1:
            raise ValueError("draft_p_min applies to one sequence at a time: the batch engine's draft model takes "
                             "its argmax on the device, without probabilities")
        self.path = engine.resolve(model)
        t0 = time.perf_counter()
        self._file = gguf.open(self.path)
        self.tokenizer = tokenizer.from_gguf(self._file)
        self._model = engine.Model(self.path)
        # With max_sequences > 1 the engine holds the weights on the device and every sequence's KV; a session
        # (a second copy on a GPU) is made only if logits() asks for one.
        self._new_session = lambda: engine.Session(self._model, n_ctx=n_ctx or 0, threads=threads or 0,
                                                   kv_type=kv_type, device="" if backend == "auto" else backend)
        self._session, self._engine, self._closed = None, None, False
        if max_sequences > 1:
            self._engine = batch.Engine(self.path, n_ctx=n_ctx, threads=threads, backend=backend, kv_type=kv_type,
                                        max_sequences=max_sequences, tokenizer=self.tokenizer,
                                        draft_model=draft_model, draft_max=draft_max)
        else:
            self._session = self._new_session()
        self._draft = None
        self._lookup_policy = DraftLength(MAX_DRAFT)  # carried over from call to call, as the draft model's
        if draft_model is not None and self._engine is None:
            self._draft = DraftModel(draft_model, self.tokenizer, os.path.basename(self.path), self._session.n_ctx,
                                     threads, backend, kv_type, max_draft=draft_max,
                                     p_min=0.5 if draft_p_min is None else draft_p_min)
        self._handles: set = set()      # the engine's requests in flight (cancel() stops them)
        self._template = self._file.metadata.get("tokenizer.chat_template")
        self._n_vocab = self._model.config["n_vocab"]
        self._cached: list[int] = []    # tokens whose K/V sit in the cache at positions 0..len-1
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        log.debug("loaded %s (%s) in %.2fs: %s", self.path, self._model.config["arch"], time.perf_counter() - t0,
                  self._model.config)

    # -- basics ------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self._engine.n_ctx if self._engine is not None and not self._closed else self._live().n_ctx

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Iterable[int], special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), special=special)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits [len(tokens), n_vocab] of every position, evaluated from position 0."""
        self._live()
        ids = self._check_prompt(tokens, room=0)
        with self._lock:
            out = self._live().eval(ids, 0, all_logits=True)
            self._cached = list(ids)
            return out

    def cancel(self) -> None:
        """Stop the generation in progress (from any thread) before its next token: every one in flight,
        with max_sequences > 1."""
        self._cancel.set()
        for h in list(self._handles):
            h.cancel()

    def close(self) -> None:
        """Free the session (KV cache, buffers) and the file mapping."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        with self._lock:
            self._closed = True
            self._session = None
            self._model = None
            self._draft = None
            self._cached = []
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- generation --------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, stop: Sequence[str] = (),
                 lookup: bool = False, draft: bool = True, **sampling) -> Completion:
        """Sampling settings (minfer.generation.SAMPLING_KEYS) and at most one constraint (minfer.constrain):
        json_schema= (a dict, JSON text or pydantic model), regex=, grammar= (Lark or GBNF) or choices=[...].
        Speculative decoding (minfer.speculative), the same tokens or the same distribution in fewer model
        steps: lookup=True drafts from the text itself (minfer.lookup), first where both are on; draft=False
        leaves the LLM's draft model out of this call."""
        pieces, tokens = [], []
        it = self._generate(prompt, max_tokens, stop, sampling, tokens, parse_special=False, lookup=lookup,
                            draft=draft)
        for piece in it:
            pieces.append(piece)
        return Completion("".join(pieces), tokens, it.metrics)

    def stream(self, prompt: str | Sequence[int], max_tokens: int = 128, stop: Sequence[str] = (),
               lookup: bool = False, draft: bool = True, **sampling) -> Iterator[str]:
        """Yields text pieces as they are generated; `self.last_metrics` holds the metrics after."""
        it = self._generate(prompt, max_tokens, stop, sampling, [], parse_special=False, lookup=lookup,
                            draft=draft)
        yield from it

    def chat(self, messages: list[dict], max_tokens: int = 256, stop: Sequence[str] = (), lookup: bool = False,
             draft: bool = True, **sampling) -> Completion:
        return self.generate(self._render(messages), max_tokens, stop, lookup, draft, _parse_special=True,
                             **sampling)

    def chat_stream(self, messages: list[dict], max_tokens: int = 256, stop: Sequence[str] = (),
                    lookup: bool = False, draft: bool = True, **sampling) -> Iterator[str]:
        it = self._generate(self._render(messages), max_tokens, stop, sampling, [], parse_special=True, lookup=lookup,
                            draft=draft)
        yield from it

    # -- internals ---------------------------------------------------------------
    def _live(self):
        if self._closed:
            raise _minfer.MinferError("this LLM is closed")
        if self._session is None:
            self._session = self._new_session()
        return self._session

    def _render(self, messages: list[dict]) -> str:
        return chat_mod.render(self._template, messages, add_generation_prompt=True)

    def _check_prompt(self, tokens, room: int) -> np.ndarray:
        ids = np.asarray(list(tokens), dtype=np.int64)
        if ids.size == 0:
            raise ValueError("the prompt is empty")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"token ids must be in [0, {self.n_vocab}); got {int(ids.min())}..{int(ids.max())}")
        if len(ids) + room > self.n_ctx:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens; with {room} to generate it needs more "
                                     f"than the context of {self.n_ctx}")
        return ids.astype(np.int32)

    def _generate(self, prompt, max_tokens, stop, sampling, tokens_out, parse_special, lookup=False, draft=True):
        parse_special = sampling.pop("_parse_special", parse_special)
        if self._engine is not None:  # it checks the request (and compiles a constraint) itself
            check_request(max_tokens, {k: v for k, v in sampling.items() if k not in constrain.CONSTRAINT_KEYS})
        else:
            constraint = constrain.pop_constraint(sampling)  # ValueError before any work
            check_request(max_tokens, sampling)
        if isinstance(prompt, str):  # (parse_special: a chat, rendered by its template)
            ids = chat_mod.encode(self.tokenizer, prompt) if parse_special else self.tokenize(prompt)
        else:
            ids = list(prompt)
        if self._closed:
            raise _minfer.MinferError("this LLM is closed")
        ids = self._check_prompt(ids, room=1 if max_tokens else 0)
        if self._engine is not None:
            return _Submitted(self, self._engine.submit(ids.tolist(), max_tokens, stop, lookup=lookup, draft=draft,
                                                        **sampling), tokens_out)
        sampling = dict(sampling)
        if sampling.get("seed") is None:  # one seed for the sampler and the draft's
            sampling["seed"] = int.from_bytes(os.urandom(8), "little")
        sampler = make_sampler(self.n_vocab, sampling, ids)  # ValueError naming a bad parameter, before any work
        matcher = None
        if constraint is not None:
            matcher = constraint.matcher(constrain.vocabulary(self.tokenizer, self.n_vocab))
        proposers = [PromptLookup(ids.tolist(), policy=self._lookup_policy)] if lookup else []
        if draft and self._draft is not None:
            proposers.append(self._draft.run(ids.tolist(), sampling))
        spec = None if not proposers else proposers[0] if len(proposers) == 1 else FirstOf(proposers)
        return _Generation(self, ids, max_tokens, list(stop), sampler, tokens_out, spec, matcher)


class _Submitted:
    """A call that runs in the batch engine: its pieces as the engine streams them."""

    def __init__(self, llm: LLM, handle, tokens_out: list):
        self.llm, self.handle, self.tokens = llm, handle, tokens_out
        self.metrics = handle.metrics

    def __iter__(self):
        self.llm._handles.add(self.handle)
        try:
            yield from self.handle
        finally:
            self.llm._handles.discard(self.handle)
            if not self.handle.done:  # the caller stopped reading
                self.handle.cancel()
            self.tokens.extend(self.handle.tokens)
            self.llm.last_metrics = self.metrics


class _Generation:
    """One call's loop, as an iterator of text pieces (holds the LLM's lock while it runs).  `spec`: the
    speculative proposer (minfer.lookup / minfer.draft) or None; `matcher`: the constraint's (minfer.constrain)
    or None."""

    def __init__(self, llm: LLM, ids: np.ndarray, max_tokens: int, stop: list, sampler, tokens_out: list,
                 spec=None, matcher=None):
        self.llm, self.ids, self.max_tokens, self.stop, self.sampler = llm, ids, max_tokens, stop, sampler
        self.spec, self.matcher = spec, matcher
        self.tokens = tokens_out
        self.metrics = Metrics(prompt_tokens=len(ids))

    def __iter__(self):
        llm, m, spec, matcher = self.llm, self.metrics, self.spec, self.matcher
        allow = matcher.mask if matcher is not None else (lambda: None)
        with llm._lock:
            llm._cancel.clear()
            sess = llm._live()
            t0 = time.perf_counter()
            ids = self.ids.tolist()
            keep = reusable_prefix(llm._cached, ids, sess.rewind_floor)  # the KV of the prefix shared with the last call
            m.cached_tokens = keep
            llm._cached = llm._cached[:keep]
            # A sampler that needs only a row's best few logits (a top-k chain, greedy) takes them where the logits
            # are: k values and ids come back instead of the vocabulary's (Session.eval_best).
            best = self.sampler.best_needed if spec is None and matcher is None else 0
            best = best if best <= _minfer.BatchRunner.best_max else 0

            def evaluate(tokens: np.ndarray, at: int):
                return sess.eval_best(tokens, at, best) if best else sess.eval(tokens, at)
            logits = evaluate(np.asarray(ids[keep:], np.int32), keep)
            llm._cached = list(ids)
            if spec is not None:
                spec.prime()
            t_prefill = time.perf_counter() - t0
            m.prefill_tps = (len(ids) - keep) / t_prefill if t_prefill > 0 else 0.0
            text = StopText(llm.tokenizer, self.stop)
            pos, t_first, t_eval = len(ids), None, 0.0
            chain = self.sampler.greedy and GREEDY_CHUNK > 0 and sess.chains  # with spec: while drafting pauses
            # A constraint's token needs its mask: no chained steps; on a GPU, greedy takes the device's argmax among
            # the allowed tokens (the mask computed while the step runs) rather than reading the logits back.
            pick_on_device = chain and matcher is not None and spec is None
            chain = chain and matcher is None
            ahead: list[int] = []  # tokens the device picked (chain), not yet taken
            check = None  # speculative: the rows of the last step whose draft tokens are still being checked
            m.stop_reason = "length"
            try:
                while m.generated_tokens < self.max_tokens:
                    if llm._cancel.is_set():
                        m.stop_reason = "cancelled"
                        break
                    if ahead:
                        tok = ahead.pop(0)
                    elif check is not None and not check.done:
                        tok = check.next_token(self.sampler, allow())
                    else:
                        tok = self.sampler.sample_best(*logits) if best else self.sampler.sample(logits[-1], allow())
                    if t_first is None:
                        t_first = time.perf_counter()
                        m.ttft_s = t_first - t0
                    if tok in llm.tokenizer.special.eog:
                        m.stop_reason = "stop"
                        break
                    self.sampler.accept(tok)
                    self.tokens.append(tok)
                    m.generated_tokens += 1
                    piece = text.push(tok)
                    if piece:
                        yield piece
                    if text.hit:
                        m.stop_reason = "stop"
                        break
                    if matcher is not None:
                        matcher.consume(tok)
                        if matcher.done:  # the grammar is complete: nothing but an end-of-generation token may follow
                            m.stop_reason = "stop"
                            break
                    if m.generated_tokens == self.max_tokens:
                        break
                    if pos >= sess.n_ctx:
                        m.stop_reason = "context"
                        break
                    t_e = time.perf_counter()
                    if spec is not None:
                        spec.extend([tok])
                        if ahead or not (check is None or check.done):
                            pass  # tok's K/V came with the step that picked it or checked its draft
                        elif chain and spec.paused():  # no drafts for a while: the device's chained steps
                            n = min(GREEDY_CHUNK, spec.paused(), self.max_tokens - m.generated_tokens,
                                    sess.n_ctx - pos)
                            ahead = sess.decode_greedy(tok, pos, n).tolist()
                            spec.skip_tokens(n)
                            spec.plain_step((time.perf_counter() - t_e) / n)
                        else:  # tok and a draft in one step
                            draft = spec.propose(min(self.max_tokens - m.generated_tokens - 1, sess.n_ctx - pos - 1))
                            t_p = time.perf_counter()
                            if draft:
                                rows = sess.eval(np.array([tok] + draft, np.int32), pos, True)
                                check, logits = Verification(rows, draft, spec.last_q, spec.policy,
                                                             time.perf_counter() - t_e), None
                            elif chain:  # nothing to check: chained steps, as without speculation
                                n = min(GREEDY_CHUNK, self.max_tokens - m.generated_tokens, sess.n_ctx - pos)
                                ahead = sess.decode_greedy(tok, pos, n).tolist()
                                spec.skip_tokens(n)
                                spec.plain_step((time.perf_counter() - t_p) / n)
                            else:
                                logits = sess.eval(np.array([tok], np.int32), pos)
                                spec.plain_step(time.perf_counter() - t_p)
                    elif pick_on_device:
                        ahead = [sess.eval_greedy(np.array([tok], np.int32), pos, matcher.mask)]
                    elif not chain:
                        logits = evaluate(np.array([tok], np.int32), pos)
                    elif not ahead:  # never more steps than tokens still to take or room in the context
                        n = min(GREEDY_CHUNK, self.max_tokens - m.generated_tokens, sess.n_ctx - pos)
                        ahead = sess.decode_greedy(tok, pos, n).tolist()
                    t_eval += time.perf_counter() - t_e
                    llm._cached.append(tok)
                    pos += 1
            finally:
                if check is not None:
                    check.close()
            rest = text.flush()
            if rest:
                yield rest
            if spec is not None:
                m.drafted_tokens, m.accepted_tokens = spec.drafted, spec.accepted
            if t_first is not None and m.generated_tokens > 1:
                t_decode = max(time.perf_counter() - t_first, 1e-9)
                m.decode_tps = (m.generated_tokens - 1) / t_decode
                m.decode_overhead = max(0.0, 1.0 - t_eval / t_decode)
            llm.last_metrics = m
            log.debug("generation: %s", m)
