"""Speculative decoding with prompt lookup: greedy decode tok/s with and without `lookup=True` on code prompts,
the same tokens checked, and the drafts' acceptance.

    python benchmarks/bench_spec.py -m qwen2.5-coder-0.5b -t 2
"""
from __future__ import annotations

import argparse
import time

from minfer import LLM

CODE = '''def parse_config(path):
    """Reads a key = value file into a dict, skipping comments and blank lines."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out
'''

PROMPTS = {
    "edit": [{"role": "user", "content": "Rename the function to read_config and keep everything else exactly as "
                                         "it is. Reply with the whole code only.\n\n" + CODE}],
    "complete": [{"role": "user", "content": "Add type hints to this function; reply with the code only.\n\n" + CODE}],
    "write": [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--backend", default="cpu")
    a = ap.parse_args()
    with LLM(a.model, threads=a.threads, backend=a.backend) as llm:
        print(f"# {llm.path}, {a.threads} threads, {a.max_tokens} greedy tokens, {time.strftime('%Y-%m-%d %H:%M')}")
        print(f"{'prompt':>9} | {'plain tok/s':>11} | {'lookup tok/s':>12} | {'x':>5} | accepted / drafted | same")
        for name, messages in PROMPTS.items():
            llm.chat(messages, max_tokens=4)  # warm-up (and the prompt's KV is cached for both runs alike)
            plain = llm.chat(messages, max_tokens=a.max_tokens)
            spec = llm.chat(messages, max_tokens=a.max_tokens, lookup=True)
            m = spec.metrics
            x = m.decode_tps / plain.metrics.decode_tps
            print(f"{name:>9} | {plain.metrics.decode_tps:11.1f} | {m.decode_tps:12.1f} | {x:5.2f} | "
                  f"{m.accepted_tokens:4d} / {m.drafted_tokens:<4d} ({m.acceptance:4.0%}) | {spec.tokens == plain.tokens}")


if __name__ == "__main__":
    main()
