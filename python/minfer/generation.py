"""What a generation request asks for and what it gives back, shared by LLM and the batch engine.

Sampling parameters (SAMPLING_KEYS) go to the native Sampler, which names any bad value; Completion is a
finished request's text, token ids and Metrics.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import _minfer


class ContextLengthError(_minfer.MinferError, ValueError):
    """A prompt (plus at least one generated token) does not fit in the context."""


@dataclass
class Metrics:
    prompt_tokens: int = 0
    cached_tokens: int = 0          # prompt tokens whose KV was already computed (an earlier call's prefix)
    generated_tokens: int = 0
    ttft_s: float = 0.0             # call start to the first sampled token
    prefill_tps: float = 0.0        # evaluated prompt tokens / prefill time
    decode_tps: float = 0.0         # generated tokens after the first / their time
    stop_reason: str = ""           # "stop" (end-of-generation token or stop string), "length", "cancelled", "context"
    decode_overhead: float = 0.0    # share of the decode time spent outside the engine (sampling, detokenizing, Python)
    drafted_tokens: int = 0         # speculative decoding (lookup=True): tokens proposed ...
    accepted_tokens: int = 0        # ... and the model confirmed

    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0


@dataclass
class Completion:
    text: str
    tokens: list = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)


SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "penalty_last_n", "logit_bias", "seed")


def check_request(max_tokens: int, sampling: dict) -> None:
    """TypeError for an unknown sampling parameter, ValueError for a negative max_tokens."""
    unknown = set(sampling) - set(SAMPLING_KEYS)
    if unknown:
        raise TypeError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")


def make_sampler(n_vocab: int, sampling: dict, prompt=()):
    """A native Sampler for these parameters (a random seed when none is given), the prompt's tokens already
    in its penalty window; ValueError names a bad parameter."""
    params = dict(sampling)
    params["logit_bias"] = {int(k): float(v) for k, v in (params.get("logit_bias") or {}).items()}
    params["seed"] = int(params["seed"]) if params.get("seed") is not None else int.from_bytes(os.urandom(8), "little")
    sampler = _minfer.Sampler(n_vocab, **params)
    for t in prompt:  # the prompt counts for the repetition penalties
        sampler.accept(int(t))
    return sampler


def reusable_prefix(cached: list[int], tokens: list[int], floor: int = 0) -> int:
    """How many leading tokens a KV cache holding `cached` can keep for `tokens`: their common prefix, leaving
    at least one token to evaluate (its logits are the next token's).  floor: the session's rewind_floor (a
    model whose local layers keep rings of KV cannot go back further than that): a shorter prefix is
    recomputed from the start."""
    keep = 0
    for a, b in zip(cached, tokens):
        if a != b:
            break
        keep += 1
    keep = min(keep, len(tokens) - 1)
    return keep if keep >= floor else 0
