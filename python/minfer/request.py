"""A request in the batch engine (minfer.batch): the handle its caller holds -- its text pieces as they come,
result(), cancel() -- and the engine's view of it (KV blocks, tokens so far, speculation and constraint state).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Iterator

from .generation import Completion, Metrics
from .lookup import PromptLookup
from .speculative import DraftLength
from .stops import StopText

if TYPE_CHECKING:
    from .batch import Engine
    from .kv_blocks import SeqBlocks

_DONE = object()  # ends a handle's stream of pieces


class Request:
    """A submitted generation: iterate it for its text pieces, or wait for `result()`; `cancel()` stops it
    before its next step."""

    def __init__(self, ids: list[int], max_tokens: int, sampler, text: StopText, eog: frozenset,
                 logprobs: int | None = None, lookup: bool = False, draft: int = 0, matcher=None):
        self.prompt = list(ids)
        self.matcher = matcher  # its constraint's state (minfer.constrain), or None
        # speculative decoding: drafts from the text itself (minfer.lookup), then from the engine's draft model
        self.lookup = PromptLookup(ids) if lookup else None
        self.draft_policy = DraftLength(draft) if draft else None  # draft: the draft model's draft_max
        self.kv_draft = None  # its state in the draft model's cache (minfer.batch_draft)
        self.draft: list[int] = []  # this step's drafted tokens, checked after it
        self.draft_from: DraftLength | None = None  # the policy of the proposer that made them
        # None: no log-probabilities; k >= 0: each generated token's, and the k likeliest (token_logprobs)
        self.logprobs = logprobs
        self.token_logprobs: list[tuple[float, list[tuple[int, float]]]] = []
        self.all_tokens = list(ids)               # prompt + generated: the sequence the engine runs
        self.max_tokens, self.sampler, self.text, self.eog = max_tokens, sampler, text, eog
        self.end = len(ids) + max_tokens  # len(all_tokens) that ends it (the engine lowers it to its context)
        self.greedy = sampler.greedy  # argmax, no penalty history to keep (asked once, not every step)
        # how many of a step's best logits its token needs (0: the whole row; logprobs read the whole row)
        self.best_k = sampler.best_needed if logprobs is None and matcher is None else 0
        self.keeps_history = sampler.best_needed == 0  # its penalties read the tokens so far (none where plain)
        self.plain = logprobs is None and matcher is None  # its token is all a step reads of its row
        self.tokens: list[int] = []               # generated
        self.metrics = Metrics(prompt_tokens=len(ids))
        self.error: BaseException | None = None
        self._engine_text = bool(text.stops)      # else the reader detokenizes (module docstring)
        self._pieces: queue.SimpleQueue = queue.SimpleQueue()  # text pieces, or token ids, then _DONE
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._engine: Engine | None = None  # told of a cancel, so that its turns need not ask every request
        self._parts: list[str] = []
        self.t_submit = self.t_admit = time.perf_counter()
        self.t_first: float | None = None
        # the engine's view: KV blocks, and how many of prompt + tokens have KV rows
        self.blocks: SeqBlocks | None = None
        self.window_blocks: SeqBlocks | None = None  # in the sliding-window layers' pool, where they have one
        self.slot = -1  # its row of the engine's block tables while it has blocks
        self.decoding = False  # this step feeds it its last token (and its draft)
        self.n_kv = 0
        self.admitted = False

    def __iter__(self) -> Iterator[str]:
        while True:
            piece = self._pieces.get()
            if piece is _DONE:
                if self.error is not None:
                    raise self.error
                if not self._engine_text and (rest := self.text.flush()):
                    yield rest
                return
            if not self._engine_text:
                piece = self.text.push(piece)
                if not piece:
                    continue
            yield piece

    def poll(self) -> tuple[list[str], bool]:
        """The text pieces that came since the last call, without waiting, and whether the request has ended
        (its error raised then): for a reader that waits elsewhere (an event loop woken by Engine.on_turn).
        Not to be mixed with iterating the handle."""
        out, done = [], False
        while True:
            try:
                piece = self._pieces.get_nowait()
            except queue.Empty:
                break
            if piece is _DONE:
                done = True
                if self.error is not None:
                    raise self.error
                if not self._engine_text and (rest := self.text.flush()):
                    out.append(rest)
                break
            if not self._engine_text:
                piece = self.text.push(piece)
            if piece:
                out.append(piece)
        return out, done

    def cancel(self) -> None:
        self._cancel.set()
        if self._engine is not None:
            self._engine._cancelled = True  # after the event: the engine's next turn looks

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Completion:
        """The finished Completion (waits; TimeoutError after `timeout` seconds)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the request did not finish in {timeout} s")
        if self.error is not None:
            raise self.error
        if self._engine_text:
            return Completion("".join(self._parts), list(self.tokens), self.metrics)
        text = StopText(self.text.detok.tok, ())  # its own decoder: an iterating reader may hold self.text
        return Completion("".join(text.push(t) for t in self.tokens) + text.flush(), list(self.tokens), self.metrics)

    # -- the engine's side --------------------------------------------------------------------------------
    def _send(self, piece: str) -> None:
        if piece:
            self._parts.append(piece)
            self._pieces.put(piece)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        m = self.metrics
        m.stop_reason = reason
        self.error = error
        if error is None and self._engine_text:
            self._send(self.text.flush())
        now = time.perf_counter()
        if self.t_first is not None and m.generated_tokens > 1:
            m.decode_tps = (m.generated_tokens - 1) / max(now - self.t_first, 1e-9)
        self._done.set()
        self._pieces.put(_DONE)
