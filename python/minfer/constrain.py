"""Constrained decoding: JSON schemas, regular expressions, grammars and fixed choices.

    llm.generate(prompt, json_schema={"type": "object", "properties": {...}})  # or a pydantic model class
    llm.generate(prompt, regex=r"\\d{4}-\\d{2}-\\d{2}")
    llm.generate(prompt, choices=["positive", "negative", "neutral"])
    llm.generate(prompt, grammar='start: "yes" | "no"')                     # Lark, or GBNF (llama.cpp's)

The grammar engine is llguidance (the `constrain` extra): it compiles a schema in about a millisecond and
computes a token mask over a 152k vocabulary in ~25 us (median), where outlines-core builds an index over the
whole vocabulary per schema (0.07-21 s for the test schemas) and has no context-free grammars, and xgrammar
needs PyTorch (benchmarks/bench_constrain.py measures them).

A request's constraint is compiled before any token is generated (a ValueError names what the library could
not compile); then each sequence has a Matcher: mask() is the bitmask of the tokens the grammar allows next
(bit t of word t // 32, end-of-generation tokens only where the grammar accepts), which the sampler (C++)
applies before its chain, or the device's argmax before it picks; consume(tok) advances it.  The vocabulary
llguidance needs is built once per tokenizer from the GGUF's token bytes.
"""
from __future__ import annotations

import functools
import json
import threading
from typing import Any, Sequence

import numpy as np

from . import _minfer, tokenizer as tokenizer_mod

CONSTRAINT_KEYS = ("json_schema", "regex", "grammar", "choices")

# Whitespace a JSON value may put between its tokens: none or one space, or a line break and an indent of up to
# 20 (as llama.cpp's schema grammars allow), so pretty-printed output works but a model cannot emit blank space
# for ever.
JSON_WHITESPACE = r"(?: |\n[ \t]{0,20})?"
JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE}
# Numbers a schema leaves open get at most 16 digits before the point and 10 after it (llama.cpp's schema
# grammars bound theirs at 16 and 16): greedy or sampled, a small model can otherwise repeat digits until
# max_tokens ("[-1000000000..." on a list of small integers).  A bound the schema sets wins; 1e-10 is the
# finest step llguidance turns into a digit bound.
NUMBER_LIMIT = 10**16 - 1
NUMBER_STEP = 1e-10


def _llguidance():
    try:
        import llguidance
        return llguidance
    except ImportError as e:  # an optional extra: say how to get it
        raise ImportError("constrained decoding needs llguidance: pip install 'minfer[constrain]'") from e


class Constraint:
    """One request's constraint, compiled to llguidance's grammar form; `kind` names what the user gave."""

    def __init__(self, kind: str, grammar: str):
        self.kind, self.grammar = kind, grammar

    def matcher(self, vocab) -> "Matcher":
        return Matcher(vocab, self)

    def __repr__(self) -> str:
        return f"Constraint({self.kind})"


def pop_constraint(kwargs: dict) -> Constraint | None:
    """Takes json_schema / regex / grammar / choices out of a call's keyword arguments and compiles the one given
    (ValueError: more than one, or one that cannot be compiled)."""
    given = {k: kwargs.pop(k) for k in CONSTRAINT_KEYS if kwargs.get(k) is not None}
    for k in CONSTRAINT_KEYS:
        kwargs.pop(k, None)
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"give one constraint, not {' and '.join(sorted(given))}")
    (kind, value), = given.items()
    return compile_constraint(kind, value)


def compile_constraint(kind: str, value: Any) -> Constraint:
    """The constraint for what a call gave (TypeError / ValueError naming what is wrong).  Compiled once per
    distinct text: the server compiles a request's to answer 400 before the engine takes it, and clients send
    the same schema again and again."""
    if kind == "json_schema":
        text = _schema(value)
    elif kind == "choices":
        text = _choices_lark(value)
    elif kind in ("regex", "grammar"):
        if not isinstance(value, str):
            raise TypeError(f"{kind} must be a string{' (Lark or GBNF)' if kind == 'grammar' else ''}, "
                            f"got {type(value).__name__}")
        text = value
    else:
        raise ValueError(f"unknown constraint {kind!r} (one of {', '.join(CONSTRAINT_KEYS)})")
    return _compiled(kind, text)


@functools.lru_cache(maxsize=256)
def _compiled(kind: str, text: str) -> Constraint:
    llg = _llguidance()
    if kind == "json_schema":
        grammar = llg.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    elif kind == "regex":
        grammar = llg.LLMatcher.grammar_from_regex(text)
    else:  # choices (as Lark) or a grammar
        if kind == "grammar" and "::=" in text:  # GBNF, llama.cpp's grammar format
            from llguidance.gbnf_to_lark import gbnf_to_lark
            try:
                text = gbnf_to_lark(text)
            except Exception as e:
                raise ValueError(f"grammar: {e}") from None
        grammar = llg.LLMatcher.grammar_from_lark(text)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"{kind}: {messages[0] if messages else 'the grammar does not compile'}")
    return Constraint(kind, grammar)


def _schema(value: Any) -> str:
    """A JSON schema as text: a dict, a JSON string, or a pydantic model (class or instance)."""
    if hasattr(value, "model_json_schema"):
        value = value.model_json_schema()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema: not valid JSON ({e})") from None
    if isinstance(value, bool):  # true / false are schemas too
        value = {} if value else {"not": {}}
    if not isinstance(value, dict):
        raise TypeError(f"json_schema must be a dict, a JSON string or a pydantic model, got {type(value).__name__}")
    return json.dumps(_bound_numbers(value))


def _bound_numbers(node: Any) -> Any:
    """A copy of a schema in which every number and integer has bounds (NUMBER_LIMIT, NUMBER_STEP: see there)."""
    if isinstance(node, list):
        return [_bound_numbers(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in ("enum", "const", "default", "examples") else _bound_numbers(v) for k, v in node.items()}
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "number" in types or "integer" in types:
        if "maximum" not in node and "exclusiveMaximum" not in node:
            out["maximum"] = NUMBER_LIMIT
        if "minimum" not in node and "exclusiveMinimum" not in node:
            out["minimum"] = -NUMBER_LIMIT
        if "number" in types and "multipleOf" not in node:
            out["multipleOf"] = NUMBER_STEP
    return out


def _choices_lark(choices: Sequence[str]) -> str:
    if isinstance(choices, str) or not isinstance(choices, Sequence):
        raise TypeError("choices must be a list of strings")
    if not choices:
        raise ValueError("choices is empty")
    for c in choices:
        if not isinstance(c, str) or not c:
            raise ValueError(f"every choice must be a non-empty string, got {c!r}")
    return "start: " + " | ".join(json.dumps(c) for c in choices)


_VOCAB_LOCK = threading.Lock()


def vocabulary(tok, n_vocab: int):
    """llguidance's view of a minfer tokenizer (every token's bytes; control tokens marked special), built once
    per tokenizer and model vocabulary size (~0.6 s at 152k tokens)."""
    with _VOCAB_LOCK:
        cached = getattr(tok, "_llg_vocab", None)
        if cached is not None and cached[0] == n_vocab:
            return cached[1]
        llg = _llguidance()
        special = (tokenizer_mod.CONTROL, tokenizer_mod.UNUSED, tokenizer_mod.UNKNOWN)
        tokens = []
        for i in range(tok.n_vocab):
            b = tok.token_bytes(i, special=True)
            if tok.types[i] in special or i in tok.special.eog:
                b = b"\xff" + b  # llguidance's mark for a special token: never part of grammar text
            tokens.append(b)
        tokens += [b""] * (n_vocab - len(tokens))  # ids past the tokenizer's (padding rows of the output)
        eog = sorted(tok.special.eog)
        if not eog:
            raise _minfer.MinferError("constrained decoding needs an end-of-generation token; the GGUF names none")

        class _Source:  # what llguidance.TokenizerWrapper reads
            eos_token_id = eog[0]
            bos_token_id = tok.special.bos
            special_token_ids = [i for i in range(tok.n_vocab) if tok.types[i] in special]

            def __call__(self, text):
                text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
                return tok.encode(text, add_special=False)

        src = _Source()
        src.tokens = tokens
        vocab = llg.LLTokenizer(llg.TokenizerWrapper(src), n_vocab=n_vocab, eos_token=eog)
        tok._llg_vocab = (n_vocab, vocab)
        return vocab


class Matcher:
    """One sequence's state in its constraint's grammar."""

    def __init__(self, vocab, constraint: Constraint):
        llg = _llguidance()
        self.constraint = constraint
        self._m = llg.LLMatcher(vocab, constraint.grammar, log_level=0)
        if self._m.is_error():
            raise ValueError(f"{constraint.kind}: {self._m.get_error()}")
        self.words = (vocab.vocab_size + 31) // 32
        self._mask = np.empty(self.words, np.int32)

    def mask(self) -> np.ndarray:
        """The tokens allowed next, as int32 words (bit t of word t // 32); the same array each call."""
        self._m.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        self._check()
        return self._mask

    def consume(self, tok: int) -> None:
        if not self._m.consume_token(tok):
            self._check()
            raise _minfer.MinferError(f"constraint: token {tok} is not allowed here")

    @property
    def done(self) -> bool:
        """The grammar is complete and nothing may follow (only an end-of-generation token is allowed)."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        return self._m.is_accepting()

    def _check(self) -> None:
        if self._m.is_error():
            raise _minfer.MinferError(f"constraint ({self.constraint.kind}): {self._m.get_error()}")


def fill_masks(executor, matchers: Sequence[tuple[Matcher, int]], out: np.ndarray) -> None:
    """Row i of `out` ([rows, words] int32) becomes matcher's mask for each (matcher, i), the matchers in parallel
    on llguidance's threads."""
    if not matchers:
        return
    if len(matchers) == 1:
        m, i = matchers[0]
        out[i] = m.mask()
        return
    executor.unsafe_compute_mask_ptr([(m._m, i) for m, i in matchers], out.ctypes.data, out.shape[1] * 4, out.shape[0])
    for m, _ in matchers:
        m._check()


def executor(threads: int | None = None):
    return _llguidance().LLExecutor(threads)
