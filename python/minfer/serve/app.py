"""The HTTP side: an ASGI app (Starlette) over one minfer.batch.Engine.

The engine runs on its own thread; the app never blocks it nor waits on it with a thread per request.  After
each turn of its loop the engine wakes the event loop (Engine.on_turn), and every open request drains its
handle without waiting (Request.poll) -- so a thousand open streams cost no threads.  A client that goes away
cancels its sequences: a stream's task is cancelled by the server when its client disconnects, a plain request
checks its connection at each wake-up.  The model loads on a thread of its own while /health answers 503.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import _minfer, chat as chat_mod, constrain, engine as engine_mod, gguf, tokenizer as tokenizer_mod
from ..batch import Engine
from ..generation import ContextLengthError
from ..speculative import MAX_DRAFT
from . import openai_api as api
from .metrics import Metrics


class Server:
    """The engine, its settings and the app's shared state."""

    def __init__(self, model: str, n_ctx: int | None = None, threads: int | None = None, backend: str = "auto",
                 max_sequences: int = 16, max_queue: int = 256, api_key: str | None = None,
                 kv_tokens: int | None = None, model_id: str | None = None, lookup: bool = False,
                 draft_model: str | None = None, draft_max: int = MAX_DRAFT):
        self.model, self.api_key, self.max_queue = model, api_key, max_queue
        self.lookup = lookup  # prompt-lookup drafts for every request that asks no logprobs (minfer.lookup)
        self.model_id = model_id or os.path.basename(str(model)).removesuffix(".gguf")
        self._engine_args = dict(n_ctx=n_ctx, threads=threads, backend=backend, max_sequences=max_sequences,
                                 kv_tokens=kv_tokens, draft_model=draft_model, draft_max=draft_max)
        self.engine: Engine | None = None
        self.template: str | None = None
        self.load_error: BaseException | None = None
        self.metrics = Metrics()
        self.created = int(time.time())
        self._turn: asyncio.Event | None = None

    # -- life ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """On the event loop: the engine loads on a thread of its own; each engine turn wakes the loop."""
        loop = asyncio.get_running_loop()
        self._turn = asyncio.Event()

        def wake():  # on the loop: every waiting request runs once
            self._turn.set()
            self._turn.clear()

        def load():
            try:
                path = engine_mod.resolve(self.model)
                with gguf.open(path) as f:
                    tok = tokenizer_mod.from_gguf(f)
                    self.template = f.metadata.get("tokenizer.chat_template")
                eng = Engine(path, tokenizer=tok, **self._engine_args)
                try:  # the grammar library's view of the vocabulary (~1 s), made here rather than in a request
                    constrain.vocabulary(tok, eng.n_vocab)
                except ImportError:
                    pass  # structured output answers 501 saying how to install it
                eng.on_turn.append(lambda: loop.call_soon_threadsafe(wake))
                self.engine = eng
            except BaseException as e:  # reported by /health and every request
                self.load_error = e

        threading.Thread(target=load, name="minfer-load", daemon=True).start()

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.close()

    async def turn(self) -> None:
        """Waits for the engine's next turn (at most a second: a request also looks at its client then)."""
        try:
            await asyncio.wait_for(self._turn.wait(), 1.0)
        except asyncio.TimeoutError:
            pass

    # -- checks --------------------------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        if self.api_key is not None and request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            raise api.APIError(401, "a valid API key is required (Authorization: Bearer KEY)",
                               kind="authentication_error", code="invalid_api_key")

    def ready(self, request: Request) -> Engine:
        """The engine, once the request is authorized and the model loaded (else the APIError that says so)."""
        self.authorize(request)
        if self.load_error is not None:
            raise api.APIError(500, f"the model failed to load: {self.load_error}", kind="server_error")
        if self.engine is None:
            raise api.APIError(503, "the model is loading", kind="server_error", headers={"Retry-After": "1"})
        return self.engine


async def _json(request: Request):
    try:
        return json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as e:
        raise api.APIError(400, f"the request body is not valid JSON: {e}") from None


def _error(e: api.APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _api_error(request: Request, e: api.APIError) -> Response:  # what any handler raises
    return _error(e)


def _prompt_ids(srv: Server, eng: Engine, job: api.Job) -> list[list[int]]:
    """Each prompt's token ids (a chat: its messages through the model's template), each checked to fit."""
    out = []
    for p in job.prompts:
        if job.kind == "chat":
            try:
                text = chat_mod.render(srv.template, p, add_generation_prompt=True)
            except chat_mod.TemplateError as e:
                raise api.APIError(400, str(e), "messages") from None
            ids = chat_mod.encode(eng.tokenizer, text)
        else:
            ids = eng.tokenizer.encode(p) if isinstance(p, str) else list(p)
        if not ids:
            raise api.APIError(400, "the prompt is empty", "messages" if job.kind == "chat" else "prompt")
        if len(ids) + (1 if job.max_tokens else 0) > eng.n_ctx:
            raise api.APIError(400, f"the prompt has {len(ids)} tokens; the context holds {eng.n_ctx}",
                               "messages" if job.kind == "chat" else "prompt", code="context_length_exceeded")
        out.append(ids)
    return out


def _submit(srv: Server, eng: Engine, job: api.Job, ids: list[list[int]]) -> list:
    if eng.waiting + len(ids) * job.n > srv.max_queue:
        srv.metrics.request("rejected")
        raise api.APIError(429, f"the server's queue is full ({eng.waiting} waiting)", kind="rate_limit_error",
                           headers={"Retry-After": "1"})
    handles = []
    try:
        for p in ids:
            for i in range(job.n):
                sampling = dict(job.sampling)
                if i and "seed" in sampling:  # n samples of one seeded request: seeds seed, seed + 1, ...
                    sampling["seed"] = (sampling["seed"] + i) % (1 << 64)
                max_tokens = job.max_tokens if job.max_tokens >= 0 else eng.n_ctx - len(p)
                speculate = srv.lookup and job.logprobs is None and not (set(sampling) & set(constrain.CONSTRAINT_KEYS))
                handles.append(eng.submit(p, max_tokens=max_tokens, stop=job.stop, logprobs=job.logprobs,
                                          lookup=speculate, **sampling))
    except (ValueError, TypeError, ContextLengthError, _minfer.MinferError) as e:
        for h in handles:
            h.cancel()
        raise api.APIError(400, str(e)) from None
    return handles


class _Tracker:
    """A request's handles as they progress: text so far, first-token and inter-token times."""

    def __init__(self, srv: Server, handles: list, n: int):
        self.srv, self.handles, self.n = srv, handles, n
        self.done = [False] * len(handles)
        self.seen = [0] * len(handles)
        self.last = [None] * len(handles)
        self.lp_seen = [0] * len(handles)   # tokens whose log-probabilities went out (streaming)
        self.chars = [0] * len(handles)     # characters of each choice's text so far (text_offset)

    def poll(self, i: int) -> list[str]:
        h = self.handles[i]
        pieces, self.done[i] = h.poll()
        n = len(h.tokens)
        if n > self.seen[i]:
            now = time.perf_counter()
            self.srv.metrics.tokens(n - self.seen[i], None if self.last[i] is None else now - self.last[i])
            if self.last[i] is None and h.metrics.ttft_s is not None:
                self.srv.metrics.first_token(h.metrics.ttft_s)
            self.seen[i], self.last[i] = n, now
        return pieces

    def logprobs(self, job: api.Job, i: int, tokenizer, everything: bool = False) -> dict | None:
        """Choice i's log-probabilities of the tokens since the last call (or of all of them)."""
        if job.logprobs is None:
            return None
        h = self.handles[i]
        n = min(len(h.tokens), len(h.token_logprobs))
        a = 0 if everything else self.lp_seen[i]
        self.lp_seen[i] = n
        out = api.logprobs(job, tokenizer.token_bytes, h.tokens[a:n], h.token_logprobs[a:n], self.chars[i])
        if job.kind == "completion":
            self.chars[i] += sum(len(t) for t in out["tokens"])
        return out

    def cancel(self) -> None:
        for h, d in zip(self.handles, self.done):
            if not d:
                h.cancel()

    def usage(self, ids: list[list[int]]) -> dict:
        return api.usage(sum(len(p) for p in ids), sum(len(h.tokens) for h in self.handles),
                         sum(h.metrics.cached_tokens for h in self.handles[::self.n]))  # a prompt's first sample

    def record(self, ids: list[list[int]], outcome: str) -> None:
        self.srv.metrics.request(outcome, sum(len(p) for p in ids), sum(len(h.tokens) for h in self.handles),
                                 sum(h.metrics.drafted_tokens for h in self.handles),
                                 sum(h.metrics.accepted_tokens for h in self.handles))


async def _completions(request: Request, kind: str) -> Response:
    srv: Server = request.app.state.server
    eng = srv.ready(request)
    job = api.parse(await _json(request), kind, eng.n_vocab)
    job.model = job.model or srv.model_id
    ids = _prompt_ids(srv, eng, job)
    handles = _submit(srv, eng, job, ids)
    tr = _Tracker(srv, handles, job.n)
    echo = [eng.tokenizer.decode(p) if job.echo else "" for p in ids for _ in range(job.n)]
    tr.chars = [len(e) for e in echo]
    if job.stream:
        return StreamingResponse(_stream(srv, eng, job, tr, ids, echo), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    texts = list(echo)
    try:
        while not all(tr.done):
            for i in range(len(handles)):
                if not tr.done[i]:
                    texts[i] += "".join(tr.poll(i))
            if all(tr.done):
                break
            if await request.is_disconnected():
                tr.cancel()
                tr.record(ids, "cancelled")
                return Response(status_code=499)
            await srv.turn()
    except Exception as e:  # an engine error in a sequence
        tr.cancel()
        tr.record(ids, "error")
        return _error(api.APIError(500, f"generation failed: {e}", kind="server_error"))
    tr.record(ids, "ok")
    reasons = [api.finish_reason(h.metrics.stop_reason) for h in handles]
    lps = [tr.logprobs(job, i, eng.tokenizer, everything=True) for i in range(len(handles))]
    return JSONResponse(api.final(job, texts, reasons, tr.usage(ids), lps))


async def _stream(srv: Server, eng: Engine, job: api.Job, tr: _Tracker, ids: list[list[int]], echo: list[str]):
    def event(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    outcome = "cancelled"
    try:
        for i in range(len(tr.handles)):
            if job.kind == "chat" or echo[i]:
                yield event(api.chunk(job, i, echo[i] or None, None, role=job.kind == "chat"))
        ended = [False] * len(tr.handles)
        while not all(ended):
            for i in range(len(tr.handles)):
                if ended[i]:
                    continue
                try:
                    text = "".join(tr.poll(i))
                except Exception as e:
                    yield event(api.APIError(500, f"generation failed: {e}", kind="server_error").body())
                    outcome = "error"
                    return
                lp = tr.logprobs(job, i, eng.tokenizer)
                if text or (lp and (lp.get("content") or lp.get("tokens"))):
                    yield event(api.chunk(job, i, text, None, lp=lp))
                if tr.done[i]:
                    ended[i] = True
                    yield event(api.chunk(job, i, None, api.finish_reason(tr.handles[i].metrics.stop_reason)))
            if not all(ended):
                await srv.turn()
        if job.include_usage:
            yield event(api.usage_chunk(job, tr.usage(ids)))
        yield "data: [DONE]\n\n"
        outcome = "ok"
    finally:  # also when the client went away (the task cancelled): its sequences stop
        if outcome != "ok":
            tr.cancel()
        tr.record(ids, outcome)


async def chat_completions(request: Request) -> Response:
    return await _completions(request, "chat")


async def completions(request: Request) -> Response:
    return await _completions(request, "completion")


async def models(request: Request) -> Response:
    srv: Server = request.app.state.server
    srv.authorize(request)
    return JSONResponse({"object": "list", "data": [{"id": srv.model_id, "object": "model", "created": srv.created,
                                                     "owned_by": "minfer"}]})


async def health(request: Request) -> Response:
    srv: Server = request.app.state.server
    if srv.load_error is not None:
        return JSONResponse({"status": "error", "error": str(srv.load_error)}, status_code=500)
    if srv.engine is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    srv: Server = request.app.state.server
    eng = srv.ready(request)
    pool = eng.pool
    return PlainTextResponse(srv.metrics.text(eng.running, eng.waiting, pool.n_blocks - pool.n_free, pool.n_blocks),
                             media_type="text/plain; version=0.0.4")


async def tokenize(request: Request) -> Response:
    srv: Server = request.app.state.server
    eng = srv.ready(request)
    body = await _json(request)
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, str):
        raise api.APIError(400, "'content' must be a string", "content")
    return JSONResponse({"tokens": eng.tokenizer.encode(content, parse_special=bool(body.get("parse_special")))})


async def detokenize(request: Request) -> Response:
    srv: Server = request.app.state.server
    eng = srv.ready(request)
    body = await _json(request)
    toks = body.get("tokens") if isinstance(body, dict) else None
    if not (isinstance(toks, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in toks)):
        raise api.APIError(400, "'tokens' must be a list of token ids", "tokens")
    if toks and (min(toks) < 0 or max(toks) >= eng.n_vocab):
        raise api.APIError(400, f"token ids must be in [0, {eng.n_vocab})", "tokens")
    return JSONResponse({"content": eng.tokenizer.decode(toks)})


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(api.APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))


def build_app(server: Server) -> Starlette:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        server.start()
        yield
        server.stop()

    app = Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ], lifespan=lifespan, exception_handlers={HTTPException: _http_error, api.APIError: _api_error})
    app.state.server = server
    return app
