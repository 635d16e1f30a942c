"""Constrained decoding: what a JSON-schema constraint costs in decode speed, and the grammar libraries compared.

    python benchmarks/bench_constrain.py -m qwen2.5-coder-0.5b -t 2 --batch 1,16 --llama-server /path/to/llama-server
    python benchmarks/bench_constrain.py -m layout:1.5b --backend cuda --batch 1,16
    python benchmarks/bench_constrain.py -m qwen2.5-coder-0.5b --libraries     # llguidance beside outlines-core

Overhead: B requests that each generate exactly T tokens (the schema, a long list of records, cannot end
sooner), greedy, with and without the constraint -- B = 1 through LLM (on a GPU the unconstrained run takes
the chained device steps; the constrained one a step per token, its mask computed while the step runs), B > 1
through the batch engine (every sequence constrained, its mask rows computed on llguidance's threads).  Decode
tok/s is B x the requests' mean decode rate (tokens after the first over their time).  Best of --repeat runs,
the two kinds alternating.

--llama-server: the same at B = 1 through llama.cpp's server (its /completion with and without `json_schema`,
greedy, `timings.predicted_per_second`), started on the same file and thread count: its own grammar's cost.

--libraries: for each of the test schemas (tests/constrain_schemas.py), the time to compile it and the time per
token mask while a valid output is fed through, on this model's vocabulary, for llguidance and (where
installed) outlines-core.  xgrammar is not measured: it needs PyTorch.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
LAYOUTS = {"0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m", "1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m",
           "7b": "deepseek-r1-distill-qwen-7b-q4_k_m"}

# Records with a few fields: many structural tokens (forced or nearly so) between short free values, and no end
# before T tokens.
RECORDS = {"type": "array", "minItems": 1000, "items": {
    "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99999},
                                     "name": {"type": "string", "maxLength": 16}, "ok": {"type": "boolean"}},
    "required": ["id", "name", "ok"], "additionalProperties": False}}
PROMPT = "List the employees as JSON records:"


def model_path(name: str) -> str:
    from minfer import engine

    if name.startswith("layout:"):
        from conftest import layout_model
        return str(layout_model(LAYOUTS[name[7:]]))
    return engine.resolve(name)


def one_sequence(path, backend, threads, T, repeat) -> dict:
    from minfer import LLM

    out = {"plain": 0.0, "schema": 0.0}
    with LLM(path, threads=threads, backend=backend) as llm:
        for _ in range(repeat):  # the two kinds alternate, so that neither has the warmer machine
            for name, kw in (("plain", {}), ("schema", {"json_schema": RECORDS})):
                c = llm.generate(PROMPT, max_tokens=T, **kw)
                if c.metrics.generated_tokens < T:
                    print(f"# note: {name} stopped after {c.metrics.generated_tokens} tokens", file=sys.stderr)
                out[name] = max(out[name], c.metrics.decode_tps)
    return out


def batched(path, backend, threads, T, B, repeat) -> dict:
    from minfer.batch import Engine

    out = {"plain": 0.0, "schema": 0.0}
    with Engine(path, threads=threads, backend=backend, max_sequences=B) as eng:
        for _ in range(repeat):
            for name, kw in (("plain", {}), ("schema", {"json_schema": RECORDS})):
                handles = [eng.submit(f"{PROMPT} ({i})", max_tokens=T, **kw) for i in range(B)]
                ms = [h.result().metrics for h in handles]
                short = [m.generated_tokens for m in ms if m.generated_tokens < T]
                if short:
                    print(f"# note: {name}: {len(short)} of {B} stopped early", file=sys.stderr)
                out[name] = max(out[name], B * float(np.mean([m.decode_tps for m in ms])))
    return out


def llama_server(exe, path, threads, T, repeat) -> dict:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    proc = subprocess.Popen([exe, "-m", path, "-t", str(threads or 2), "-c", "4096", "--host", "127.0.0.1", "--port",
                             str(port), "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        out = {"plain": 0.0, "schema": 0.0}
        for _ in range(repeat):
            for name, extra in (("plain", {"ignore_eos": True}), ("schema", {"json_schema": RECORDS})):
                body = dict(prompt=PROMPT, n_predict=T, temperature=0.0, top_k=1, cache_prompt=False, **extra)
                req = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
                r = json.load(urllib.request.urlopen(req, timeout=600))
                if r["timings"]["predicted_n"] < T:
                    print(f"# note: llama.cpp {name} stopped after {r['timings']['predicted_n']}", file=sys.stderr)
                out[name] = max(out[name], r["timings"]["predicted_per_second"])
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def libraries(path) -> None:
    from constrain_schemas import SCHEMAS
    from minfer import constrain, gguf, tokenizer

    with gguf.open(path) as f:
        tok = tokenizer.from_gguf(f)
    n_vocab = tok.n_vocab
    t0 = time.perf_counter()
    vocab = constrain.vocabulary(tok, n_vocab)
    print(f"# {path}: {n_vocab} tokens; llguidance vocabulary built in {time.perf_counter() - t0:.2f} s")
    try:
        import outlines_core
        from outlines_core import json_schema as oc_json
        t0 = time.perf_counter()
        by_bytes: dict = {}
        for i in range(n_vocab):
            if tok.types[i] == tokenizer.NORMAL and i not in tok.special.eog:
                by_bytes.setdefault(tok.token_bytes(i), []).append(i)
        oc_vocab = outlines_core.Vocabulary(min(tok.special.eog), by_bytes)
        print(f"# outlines-core vocabulary built in {time.perf_counter() - t0:.2f} s")
    except ImportError:
        outlines_core = None
    print("| schema | llguidance compile ms | mask us (median / max) | outlines-core compile ms | mask us (median / max) |")
    print("|---|---|---|---|---|")
    words = (n_vocab + 31) // 32
    mask = np.zeros(words, np.int32)
    totals = {"llg": [], "oc": []}
    for k, (_, schema) in enumerate(SCHEMAS):
        text = json.dumps(example(schema))
        ids = tok.encode(text, add_special=False)
        t0 = time.perf_counter()
        m = constrain.compile_constraint("json_schema", schema).matcher(vocab)
        llg_compile = (time.perf_counter() - t0) * 1e3
        llg_masks = []
        for t in ids:
            t1 = time.perf_counter()
            m.mask()
            llg_masks.append(time.perf_counter() - t1)
            m.consume(t)
        row = f"| {k} | {llg_compile:.2f} | {np.median(llg_masks) * 1e6:.1f} / {max(llg_masks) * 1e6:.0f} |"
        totals["llg"] += llg_masks
        if outlines_core is not None:
            t0 = time.perf_counter()
            guide = outlines_core.Guide(outlines_core.Index(oc_json.build_regex_from_schema(json.dumps(schema)),
                                                            oc_vocab))
            oc_compile = (time.perf_counter() - t0) * 1e3
            oc_masks = []
            for t in ids:
                t1 = time.perf_counter()
                guide.write_mask_into(mask.ctypes.data, mask.size, 4)
                oc_masks.append(time.perf_counter() - t1)
                guide.advance(t)
            totals["oc"] += oc_masks
            row += f" {oc_compile:.0f} | {np.median(oc_masks) * 1e6:.1f} / {max(oc_masks) * 1e6:.0f} |"
        print(row)
    for lib, ts in totals.items():
        if ts:
            print(f"# {lib}: {len(ts)} masks, median {np.median(ts) * 1e6:.1f} us, p99 {np.percentile(ts, 99) * 1e6:.0f} us")


def example(schema: dict, defs: dict | None = None):
    """A small valid instance of one of the test schemas (enough of JSON Schema for them)."""
    defs = defs if defs is not None else schema.get("$defs", {})
    if "$ref" in schema:
        return example(defs[schema["$ref"].split("/")[-1]], defs)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return example(schema["anyOf"][0], defs)
    t = schema.get("type", "object")
    t = t[0] if isinstance(t, list) else t
    if t == "object":
        props = schema.get("properties", {})
        return {k: example(v, defs) for k, v in props.items() if k in schema.get("required", props)}
    if t == "array":
        return [example(schema.get("items", {}), defs) for _ in range(max(schema.get("minItems", 1), 1))]
    if t == "string":
        if "pattern" in schema:  # the test schemas' patterns, filled by hand
            return {"^[A-Z]{3}-[0-9]{4}$": "ABC-1234", "^[A-Z]{3}$": "CDG", "^[a-z]{1,12}$": "quanta",
                    "^2[0-9]{3}-[01][0-9]-[0-3][0-9]$": "2024-05-17",
                    "^[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,2}$": "1.2.3"}[schema["pattern"]]
        return "abc"
    if t == "integer":
        return max(schema.get("minimum", 1), 1) if schema.get("maximum", 1) >= 1 else schema["maximum"]
    if t == "number":
        return float(schema.get("minimum", 0.5)) if schema.get("minimum", 0) > 0 else 0.5
    if t == "boolean":
        return True
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--batch", default="1", help="batch sizes (1: one sequence through LLM)")
    ap.add_argument("-n", "--tokens", type=int, default=128, help="tokens each request generates")
    ap.add_argument("-r", "--repeat", type=int, default=3)
    ap.add_argument("--libraries", action="store_true")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server, for its grammar's cost at B = 1")
    a = ap.parse_args()
    path = model_path(a.model)
    if a.libraries:
        return libraries(path)
    print(f"# {path}, backend {a.backend}, {a.threads or 'default'} threads, T={a.tokens}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print("| B | decode tok/s plain | with the schema | ratio |")
    print("|---|---|---|---|")
    for B in (int(x) for x in a.batch.split(",")):
        r = (one_sequence(path, a.backend, a.threads or None, a.tokens, a.repeat) if B == 1 else
             batched(path, a.backend, a.threads or None, a.tokens, B, a.repeat))
        print(f"| {B} | {r['plain']:.1f} | {r['schema']:.1f} | {r['schema'] / r['plain']:.3f} |", flush=True)
    if a.llama_server:
        r = llama_server(a.llama_server, path, a.threads, a.tokens, a.repeat)
        print(f"| llama-server, 1 | {r['plain']:.1f} | {r['schema']:.1f} | {r['schema'] / r['plain']:.3f} |")


if __name__ == "__main__":
    main()
