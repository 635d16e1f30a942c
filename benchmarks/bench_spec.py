"""Speculative decoding: greedy decode tok/s on code prompts without speculation, with prompt lookup, with a
draft model and with both, the same tokens checked, and the drafts' acceptance; beside llama.cpp's
`llama-speculative` on the same pair of files when its binaries are given (built from llama.cpp's public source).

    python benchmarks/bench_spec.py -m qwen2.5-coder-1.5b -d qwen2.5-coder-0.5b -t 2 \\
        [--llama-bin ~/llama.cpp/build/bin]
    python benchmarks/bench_spec.py -m MODEL --backend cuda --oracle   # the machinery's ceiling (below)
    python benchmarks/bench_spec.py -m MODEL -d DRAFT --batch 1,8,16 --prompt write -n 256

--oracle: drafts are the plain run's own next tokens, always right, through prompt lookup's path in the
single-sequence loop and in the batch engine: what checking drafts costs and gains on a device where a
random-weight model accepts nothing.
--batch B,...: the batch engine with B requests at once (the prompt with " 0", " 1", ... appended): generated
tokens over the whole time without speculation, with the draft model, with prompt lookup, greedy and sampled;
a warm-up round, then the median of -r rounds that alternate the modes.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import re
import statistics
import subprocess
import tempfile
import time

from minfer import LLM
from minfer.speculative import MAX_DRAFT

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


def llama_speculative(bin_dir, target, draft, prompt_text, a):
    """llama-speculative's decode tok/s, drafted and accepted for one prompt (greedy, same draft length)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt_text)
    try:
        out = subprocess.run([os.path.join(bin_dir, "llama-speculative"), "-m", target, "-md", draft, "-f", f.name,
                              "-n", str(a.max_tokens), "-t", str(a.threads), "-td", str(a.threads), "--temp", "0",
                              "--spec-draft-n-max", str(a.draft_max), "-c", "4096", "-s", "1"],
                             capture_output=True, text=True, timeout=600).stderr
    finally:
        os.unlink(f.name)
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+)", out)
    drafted, accepted = re.search(r"n_drafted\s*=\s*(\d+)", out), re.search(r"n_accept\s*=\s*(\d+)", out)
    if not (speed and drafted and accepted):
        raise RuntimeError(f"llama-speculative gave no speed:\n{out[-2000:]}")
    return float(speed.group(3)), int(drafted.group(1)), int(accepted.group(1))


def llama_plain(bin_dir, target, a) -> float:
    out = subprocess.run([os.path.join(bin_dir, "llama-bench"), "-m", target, "-t", str(a.threads), "-p", "0",
                          "-n", str(a.max_tokens), "-r", str(a.repeat), "-o", "csv"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return float(list(csv.DictReader(io.StringIO(out)))[-1]["avg_ts"])


def oracle(a) -> None:
    """Greedy decode with drafts that are always right (the plain output fed back), per path."""
    from minfer import batch, llm as llm_mod, lookup

    class Oracle(lookup.PromptLookup):
        answer: list[int] = []

        def guess(self, room: int) -> list[int]:
            limit = self.policy.limit(room)
            done = len(self.tokens) - self.n_prompt
            return Oracle.answer[done:done + limit] if limit > 0 else []

        def extend(self, tokens):
            if not hasattr(self, "n_prompt"):
                self.n_prompt = len(tokens)
            super().extend(tokens)

    for max_sequences in (1, 2):
        path = "single sequence" if max_sequences == 1 else "batch engine"
        with LLM(a.model, threads=a.threads, backend=a.backend, max_sequences=max_sequences) as llm:
            ids = llm.tokenize("def parse_config(path):")
            plain = [llm.generate(ids, max_tokens=a.max_tokens) for _ in range(a.repeat)]
            Oracle.answer = plain[0].tokens
            llm_mod.PromptLookup, batch.PromptLookup = Oracle, Oracle
            try:
                spec = [llm.generate(ids, max_tokens=a.max_tokens, lookup=True) for _ in range(a.repeat)]
            finally:
                llm_mod.PromptLookup, batch.PromptLookup = lookup.PromptLookup, lookup.PromptLookup
            p = statistics.median(r.metrics.decode_tps for r in plain)
            o = statistics.median(r.metrics.decode_tps for r in spec)
            m = spec[-1].metrics
            print(f"{path:>15} | plain {p:8.1f} tok/s | drafts always right {o:8.1f} ({o / p:.2f}x) | "
                  f"{m.accepted_tokens} / {m.drafted_tokens} | same tokens {spec[-1].tokens == plain[0].tokens}",
                  flush=True)


def batched(a) -> None:
    from minfer.batch import Engine

    with LLM(a.model, threads=a.threads, backend=a.backend) as llm:
        base = llm._render(PROMPTS[a.prompt])
    sampled = dict(temperature=0.8, top_k=40, seed=1)
    modes = {"plain": dict(draft=False), "draft": {}, "lookup": dict(lookup=True, draft=False),
             "plain sampled": dict(draft=False, **sampled), "draft sampled": dict(sampled)}
    for b in (int(x) for x in a.batch.split(",")):
        with Engine(a.model, threads=a.threads, backend=a.backend, max_sequences=b, draft_model=a.draft_model) as eng:
            prompts = [f"{base} {i}" for i in range(b)]
            runs: dict[str, list] = {m: [] for m in modes}
            for rnd in range(a.repeat + 1):
                for mode, kw in modes.items():
                    if mode.startswith("draft") and not a.draft_model:
                        continue
                    t = time.perf_counter()
                    outs = [h.result(timeout=900) for h in
                            [eng.submit(p, max_tokens=a.max_tokens, parse_special=True, **kw) for p in prompts]]
                    if rnd:
                        runs[mode].append((sum(len(o.tokens) for o in outs) / (time.perf_counter() - t), outs))
            line = [f"B={b}"]
            for mode, rs in runs.items():
                if not rs:
                    continue
                tps = statistics.median(r[0] for r in rs)
                ref = statistics.median(r[0] for r in runs["plain sampled" if "sampled" in mode else "plain"])
                outs = rs[-1][1]
                line.append(f"{mode} {tps:.0f} ({tps / ref:.2f}x, {sum(o.metrics.accepted_tokens for o in outs)}/"
                            f"{sum(o.metrics.drafted_tokens for o in outs)})")
            print(", ".join(line), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-d", "--draft-model", default=None, help="a draft model (none: prompt lookup only)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("-r", "--repeat", type=int, default=3, help="rounds (each mode once a round); medians reported")
    ap.add_argument("--draft-max", type=int, default=MAX_DRAFT)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--llama-bin", default=None, help="a folder with llama.cpp's llama-speculative and llama-bench")
    ap.add_argument("--oracle", action="store_true", help="drafts that are always right: the machinery's ceiling")
    ap.add_argument("--batch", default=None, help="batch sizes for the batch engine's runs, e.g. 1,8,16")
    ap.add_argument("--prompt", default="write", choices=sorted(PROMPTS), help="the --batch runs' prompt")
    a = ap.parse_args()
    if a.batch:
        print(f"# {a.model}, draft {a.draft_model}, {a.backend}, {a.max_tokens} tokens a request, median of "
              f"{a.repeat}, {time.strftime('%Y-%m-%d %H:%M')}")
        return batched(a)
    if a.oracle:
        print(f"# {a.model}, {a.backend}, {a.max_tokens} greedy tokens, median of {a.repeat}, "
              f"{time.strftime('%Y-%m-%d %H:%M')}")
        return oracle(a)
    with LLM(a.model, threads=a.threads, backend=a.backend, draft_model=a.draft_model, draft_max=a.draft_max) as llm:
        modes = {"plain": dict(draft=False), "lookup": dict(lookup=True, draft=False)}
        if a.draft_model:
            modes.update({"draft": dict(), "lookup+draft": dict(lookup=True)})
        print(f"# {llm.path}, draft {a.draft_model}, {a.threads} threads, {a.max_tokens} greedy tokens, "
              f"median of {a.repeat}, {time.strftime('%Y-%m-%d %H:%M')}")
        print(f"{'prompt':>9} | {'mode':>12} | {'tok/s':>6} | {'x plain':>7} | accepted / drafted | same tokens")
        for name, messages in PROMPTS.items():
            llm.chat(messages, max_tokens=4, draft=False)  # warm-up (and the prompt's KV is cached for all runs)
            base = None
            runs = {mode: [] for mode in modes}
            for _ in range(a.repeat):  # rounds alternate the modes: the VM's bandwidth drifts between phases
                for mode, kw in modes.items():
                    runs[mode].append(llm.chat(messages, max_tokens=a.max_tokens, **kw))
            for mode, results in runs.items():
                tps = statistics.median(r.metrics.decode_tps for r in results)
                m = results[-1].metrics
                base = base or (tps, results[0].tokens)
                print(f"{name:>9} | {mode:>12} | {tps:6.1f} | {tps / base[0]:7.2f} | {m.accepted_tokens:4d} / "
                      f"{m.drafted_tokens:<4d} ({m.acceptance:4.0%}) | {all(r.tokens == base[1] for r in results)}",
                      flush=True)
            if a.llama_bin and a.draft_model:
                from minfer import engine
                target, draft = engine.resolve(a.model), engine.resolve(a.draft_model)
                tps, drafted, accepted = llama_speculative(a.llama_bin, target, draft, llm._render(messages), a)
                if name == "edit":
                    llama_base = llama_plain(a.llama_bin, target, a)
                    print(f"{'':>9} | {'llama plain':>12} | {llama_base:6.1f} | (llama-bench tg{a.max_tokens})")
                print(f"{name:>9} | {'llama draft':>12} | {tps:6.1f} | {tps / llama_base:7.2f} | {accepted:4d} / "
                      f"{drafted:<4d} ({accepted / max(drafted, 1):4.0%}) | (llama-speculative)", flush=True)


if __name__ == "__main__":
    main()
