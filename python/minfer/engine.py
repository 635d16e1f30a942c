"""The engine from Python: a model, a session over it, and the decode loop.

    >>> import minfer.engine as E
    >>> sess = E.session("qwen2.5-coder-0.5b", threads=2)        # a name from minfer.hub, or a path
    >>> for tok in E.greedy(sess, [9707, 11, 1879], max_tokens=8):
    ...     print(tok)

The native objects (`minfer._minfer.Model`, `Session`, `Plan`) do the work: a
Session evaluates one step (a prompt, or one token) and returns logits; the
loop that turns logits into the next token lives here, in Python.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator

import numpy as np

from . import _minfer, hub

Model = _minfer.Model
Session = _minfer.Session
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


def greedy(sess: Session, prompt: Iterable[int], max_tokens: int, start_pos: int = 0,
           stop: Iterable[int] = (), chunk: int = 16) -> Iterator[int]:
    """Yields greedily decoded token ids: one prompt step, then steps `chunk` at a time
    (Session.decode_greedy: on a GPU the chunk's steps run back to back on the device, with no host
    turn between them).  A stop token is the last one yielded; the steps a chunk ran past it are
    dropped (their KV entries lie past the position and are overwritten by whatever comes next)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    ids = np.asarray(list(prompt), dtype=np.int32)
    stop = set(stop)
    tok = sess.eval_greedy(ids, start_pos)  # the argmax is taken where the logits are (4 bytes back from a GPU)
    pos = start_pos + len(ids)
    ahead: list[int] = []  # decoded, not yet yielded
    for i in range(max_tokens):
        yield tok
        if tok in stop or pos >= sess.n_ctx or i + 1 == max_tokens:
            return
        if not ahead:  # never more steps than can still be yielded or fit in the context
            ahead = sess.decode_greedy(tok, pos, min(chunk, max_tokens - 1 - i, sess.n_ctx - pos)).tolist()
        tok = ahead.pop(0)
        pos += 1
