"""The OpenAI API's request bodies read into what the engine takes, and its response shapes.

A field of the wrong type or out of range is an APIError naming it (400, OpenAI's error body); fields minfer
does not implement are refused by name rather than ignored.  Structured output: `response_format` {"type":
"json_schema", "json_schema": {"schema": ...}} or {"type": "json_object"}, and llama.cpp's server fields
`json_schema` and `grammar` (GBNF or Lark), compiled here so that a bad one is a 400 before any work.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from .. import constrain


class APIError(Exception):
    """An error answered as OpenAI answers it: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Job:
    """One request as the engine runs it: prompts (text or token ids; chat: one rendered text), n samples
    each, and the engine's keyword arguments."""
    kind: str                   # "completion" or "chat"
    prompts: list               # str or list[int] each
    n: int
    max_tokens: int
    stop: list[str]
    sampling: dict
    stream: bool
    include_usage: bool
    echo: bool = False
    logprobs: int | None = None  # None: none asked; k: each token's and the k likeliest
    parse_special: bool = False
    model: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


# The sampling fields OpenAI names and minfer's own extras, as the engine calls them.
_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
             "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
             "repeat_penalty": "repeat_penalty", "repetition_penalty": "repeat_penalty", "seed": "seed",
             "logit_bias": "logit_bias"}
_IGNORED = {"model", "user", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens", "stop",
            "prompt", "messages", "echo", "suffix", "logprobs", "top_logprobs", "response_format", "json_schema",
            "grammar", "tools",
            "tool_choice", "parallel_tool_calls", "best_of", "service_tier", "store", "metadata"}
_REFUSED = {"suffix": "suffix (insertion) is not supported",
            "tools": "tools are not supported yet", "tool_choice": "tools are not supported yet",
            "best_of": "best_of is not supported"}


def _number(body: dict, name: str, lo: float, hi: float, integer: bool = False):
    v = body.get(name)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        raise APIError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, got {v!r}", name)
    if not lo <= v <= hi:
        raise APIError(400, f"'{name}' must be in [{lo}, {hi}], got {v}", name)
    return v


def parse(body, kind: str, n_vocab: int, max_n: int = 16) -> Job:
    """A /v1/completions (kind "completion") or /v1/chat/completions ("chat") body -> Job."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, [], ""):
            raise APIError(400, why, name)
    constraint = _constraint(body)
    unknown = sorted(set(body) - _IGNORED - set(_SAMPLING))
    if unknown:
        raise APIError(400, f"unknown field(s): {', '.join(unknown)}", unknown[0])

    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError(400, "'messages' must be a non-empty list", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise APIError(400, f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
            c = m.get("content")
            if isinstance(c, list):  # content parts: text only
                if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                           for p in c):
                    raise APIError(400, f"messages[{i}].content: only text parts are supported",
                                   f"messages[{i}].content")
                m = dict(m, content="".join(p["text"] for p in c))
                messages[i] = m
            elif not isinstance(c, str):
                raise APIError(400, f"messages[{i}].content must be a string", f"messages[{i}].content")
        prompts = [messages]
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            prompts = [p]
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            prompts = [p]
        elif isinstance(p, list) and p and all(isinstance(t, str) for t in p):
            prompts = list(p)
        elif isinstance(p, list) and p and all(isinstance(t, list) and t and all(isinstance(i, int) for i in t)
                                               for t in p):
            prompts = list(p)
        else:
            raise APIError(400, "'prompt' must be a string, a list of strings, a list of token ids, or a list of "
                                "such lists", "prompt")
        for q in prompts:
            if isinstance(q, list) and (min(q) < 0 or max(q) >= n_vocab):
                raise APIError(400, f"token ids must be in [0, {n_vocab})", "prompt")

    mt = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, mt, 0, 1 << 30, integer=True)
    n = _number(body, "n", 1, max_n, integer=True) or 1
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop)):
        raise APIError(400, "'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    sampling = {}
    for name, key in _SAMPLING.items():
        if name == "logit_bias":
            lb = body.get(name)
            if lb is None:
                continue
            if not isinstance(lb, dict):
                raise APIError(400, "'logit_bias' must map token ids to numbers", name)
            try:
                sampling[key] = {int(k): float(v) for k, v in lb.items()}
            except (TypeError, ValueError):
                raise APIError(400, "'logit_bias' must map token ids to numbers", name) from None
            if any(not 0 <= k < n_vocab for k in sampling[key]):
                raise APIError(400, f"'logit_bias' token ids must be in [0, {n_vocab})", name)
            continue
        bounds = {"temperature": (0, 2), "top_p": (0, 1), "min_p": (0, 1), "top_k": (0, n_vocab),
                  "presence_penalty": (-2, 2), "frequency_penalty": (-2, 2), "repeat_penalty": (0, 10),
                  "repetition_penalty": (0, 10), "seed": (-(1 << 63), (1 << 64) - 1)}[name]
        v = _number(body, name, *bounds, integer=name in ("top_k", "seed"))
        if v is not None:
            sampling[key] = v
    sampling.update(constraint)
    if "seed" in sampling:
        sampling["seed"] = sampling["seed"] % (1 << 64)
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise APIError(400, "'stream_options' must be an object", "stream_options")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, "'stream' must be a boolean", "stream")
    logprobs = None
    if kind == "chat":
        want = body.get("logprobs", False)
        if not isinstance(want, bool):
            raise APIError(400, "'logprobs' must be a boolean", "logprobs")
        top = _number(body, "top_logprobs", 0, 20, integer=True)
        if top is not None and not want:
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top or 0) if want else None
    else:
        logprobs = _number(body, "logprobs", 0, 20, integer=True)
        if body.get("top_logprobs") is not None:
            raise APIError(400, "'top_logprobs' is a chat field; completions take 'logprobs': k", "top_logprobs")
    echo = body.get("echo", False)
    if kind == "completion" and not isinstance(echo, bool):
        raise APIError(400, "'echo' must be a boolean", "echo")
    return Job(kind=kind, prompts=prompts, n=n, max_tokens=16 if max_tokens is None and kind == "completion"
               else max_tokens if max_tokens is not None else -1, stop=stop, sampling=sampling, stream=stream,
               include_usage=bool((so or {}).get("include_usage")), echo=bool(echo) and kind == "completion",
               model=str(body.get("model") or ""), logprobs=logprobs)


def _constraint(body: dict) -> dict:
    """The request's constraint as the engine's keyword ({} for none); a 400 naming the field where it is not one
    minfer can compile."""
    found = {}
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            found["response_format"] = {"type": "object"}
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict):
                raise APIError(400, "response_format.json_schema must be an object with a 'schema'", "response_format")
            schema = spec.get("schema", {})
            if not isinstance(schema, (dict, bool)):
                raise APIError(400, "response_format.json_schema.schema must be a JSON schema object",
                               "response_format")
            found["response_format"] = schema
        elif kind != "text":
            raise APIError(400, "response_format.type must be 'text', 'json_object' or 'json_schema'",
                           "response_format")
    for name in ("json_schema", "grammar"):  # llama.cpp's server fields
        if body.get(name) is not None:
            found[name] = body[name]
    if len(found) > 1:
        raise APIError(400, f"give one of {', '.join(sorted(found))}, not several", sorted(found)[0])
    if not found:
        return {}
    (name, value), = found.items()
    kind = "grammar" if name == "grammar" else "json_schema"
    try:
        constrain.compile_constraint(kind, value)
    except (ValueError, TypeError) as e:
        raise APIError(400, f"{name}: {e}", name) from None
    except ImportError as e:
        raise APIError(501, str(e), name, kind="server_error") from None
    return {kind: value}


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}


def finish_reason(stop_reason: str | None) -> str | None:
    """The engine's stop reason in OpenAI's words ("context": the context filled up, reported as "length")."""
    return {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}.get(stop_reason or "",
                                                                                          stop_reason)


def logprobs(job: Job, token_bytes, tokens: list[int], lps: list, offset: int = 0) -> dict | None:
    """The `logprobs` of a choice or a chunk for these tokens (lps: (logprob, [(token, logprob)...]) each),
    in the chat shape or the completions one (`offset`: the characters of the choice's text before them)."""
    if job.logprobs is None:
        return None

    def text(t):
        b = token_bytes(t)
        return b.decode("utf-8", "replace"), list(b)
    if job.kind == "chat":
        return {"content": [{"token": text(t)[0], "logprob": lp, "bytes": text(t)[1],
                             "top_logprobs": [{"token": text(u)[0], "logprob": v, "bytes": text(u)[1]} for u, v in top]}
                            for t, (lp, top) in zip(tokens, lps)]}
    strs = [text(t)[0] for t in tokens]
    offsets = []
    for s_ in strs:
        offsets.append(offset)
        offset += len(s_)
    return {"tokens": strs, "token_logprobs": [lp for lp, _ in lps],
            "top_logprobs": [{text(u)[0]: v for u, v in top} for _, top in lps], "text_offset": offsets}


def chunk(job: Job, index: int, text: str | None, reason: str | None, role: bool = False, lp: dict | None = None) -> dict:
    """One streamed piece: a completion's text or a chat message's delta."""
    if job.kind == "chat":
        delta = {}
        if role:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": reason}
        obj = "text_completion"
    return {"id": _id(job), "object": obj, "created": job.created, "model": job.model, "choices": [choice]}


def final(job: Job, texts: list[str], reasons: list[str | None], use: dict, lps: list | None = None) -> dict:
    """The whole response of a request that did not stream (lps: each choice's `logprobs`)."""
    lps = lps or [None] * len(texts)
    if job.kind == "chat":
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": lp,
                    "finish_reason": r} for i, (t, r, lp) in enumerate(zip(texts, reasons, lps))]
        obj = "chat.completion"
    else:
        choices = [{"index": i, "text": t, "logprobs": lp, "finish_reason": r}
                   for i, (t, r, lp) in enumerate(zip(texts, reasons, lps))]
        obj = "text_completion"
    return {"id": _id(job), "object": obj, "created": job.created, "model": job.model, "choices": choices,
            "usage": use}


def usage_chunk(job: Job, use: dict) -> dict:
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    return {"id": _id(job), "object": obj, "created": job.created, "model": job.model, "choices": [], "usage": use}


def _id(job: Job) -> str:
    return ("chatcmpl-" if job.kind == "chat" else "cmpl-") + job.id
