"""The engine from Python: its design objects, a session over them, and the decode loop.

    >>> import minfer.engine as E
    >>> sched = E.scheduler("qwen2.5-coder-0.5b", threads=2)     # a name from minfer.hub, or a path
    >>> [b.name for b in sched.backends]                         # devices in priority order
    ['cpu', 'reference']
    >>> plan = sched.schedule(E.Graph.decoder(sched, n_tokens=1))  # assigned, fused, allocated, split
    >>> for tok in E.greedy(sched, [9707, 11, 1879], max_tokens=8):
    ...     print(tok)

Backend is a device (its name, the fused ops it has kernels for).  Graph is an architecture's graph for a
step (Graph.decoder) or one built op by op (Graph().input / .add).  Scheduler assigns a graph's nodes to its
backends, fuses, allocates and finds the splits (a Plan), and runs plans: step (tokens at positions),
step_greedy (the argmax found where the logits are), greedy_chain (one-token steps chained on the device
where it can).  Session is the convenience over a Scheduler for one sequence (eval -> logits, with its plans
cached).  BatchRunner runs steps of many sequences over one paged KV pool (minfer.batch schedules them).
The loop that turns logits into the next token lives here, in Python.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator

import numpy as np

from . import _minfer, hub

Model = _minfer.Model
Backend = _minfer.Backend
Graph = _minfer.Graph
Plan = _minfer.Plan
Scheduler = _minfer.Scheduler
Session = _minfer.Session
BatchRunner = _minfer.BatchRunner
force_kernel = _minfer.force_kernel      # the test hook: force a kernel choice ("auto" gives it back to the rule)
kernel_choices = _minfer.kernel_choices  # the choices it takes, their values and what they force


def resolve(path_or_name: str | os.PathLike) -> str:
    """A local GGUF path, or a model name known to minfer.hub (downloaded once)."""
    p = os.fspath(path_or_name)
    if os.path.exists(p):
        return p
    if p in hub.MODELS:
        return str(hub.fetch(p))
    raise FileNotFoundError(f"{p!r} is neither a file nor a known model ({', '.join(sorted(hub.MODELS))})")


def load(path_or_name: str | os.PathLike) -> Model:
    return Model(resolve(path_or_name))


def session(path_or_name, n_ctx: int = 0, threads: int = 0, kv_type: str = "f16", **kw) -> Session:
    return Session(load(path_or_name), n_ctx=n_ctx, threads=threads, kv_type=kv_type, **kw)


def scheduler(path_or_name, n_ctx: int = 0, threads: int = 0, kv_type: str = "f16", **kw) -> Scheduler:
    return Scheduler(load(path_or_name), n_ctx=n_ctx, threads=threads, kv_type=kv_type, **kw)


def greedy(runner: Scheduler | Session, prompt: Iterable[int], max_tokens: int, start_pos: int = 0,
           stop: Iterable[int] = (), chunk: int = 16) -> Iterator[int]:
    """Yields greedily decoded token ids: one prompt step, then one-token steps `chunk` at a time
    (Scheduler.greedy_chain: on a GPU the chunk's steps run back to back on the device, with no host turn
    between them).  A stop token is the last one yielded; the steps a chunk ran past it are dropped (their
    KV entries lie past the position and are overwritten by whatever comes next).  `runner` is a Scheduler
    (plans are made here, per call) or a Session (its scheduler and its cached plans)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if isinstance(runner, Session):
        sched, plan = runner.scheduler, (lambda n: runner.plan(n))
    else:
        sched, plans = runner, {}

        def plan(n: int) -> Plan:
            if n not in plans:
                plans[n] = sched.schedule(Graph.decoder(sched, n))
            return plans[n]
    ids = np.asarray(list(prompt), dtype=np.int32)
    if len(ids) == 0:
        raise ValueError("greedy: an empty prompt")
    stop = set(stop)
    tok = sched.step_greedy(plan(len(ids)), ids, start_pos)  # 4 bytes back from a GPU
    pos = start_pos + len(ids)
    ahead: list[int] = []  # decoded, not yet yielded
    for i in range(max_tokens):
        yield tok
        if tok in stop or pos >= sched.n_ctx or i + 1 == max_tokens:
            return
        if not ahead:  # never more steps than can still be yielded or fit in the context
            ahead = sched.greedy_chain(plan(1), tok, pos, min(chunk, max_tokens - 1 - i, sched.n_ctx - pos)).tolist()
        tok = ahead.pop(0)
        pos += 1
