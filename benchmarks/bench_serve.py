"""Serving over HTTP: N concurrent streaming clients against `python -m minfer.serve`, and against
llama.cpp's `llama-server` on the same file when LLAMA_SERVER names a binary built from its source.

    python benchmarks/bench_serve.py -m qwen2.5-coder-0.5b -t 2 --clients 1,4,8 --tokens 64
    LLAMA_SERVER=/path/to/llama-server python benchmarks/bench_serve.py ...   # both, same run

Each client sends its own prompt (greedy, `max_tokens` tokens, stream) through the OpenAI API; each N runs
twice, a round warming the server to that load, then the measured round on new prompts; for each N: aggregate generated tok/s (all tokens over the wall time of the round), time to first token and
inter-token latency p50 / p99 (client side), and whether every stream's text equals that prompt's text
alone.  Servers listen on 127.0.0.1; each gets N parallel slots / sequences; llama-server a context of 8192
tokens shared by its slots, minfer 8192 a sequence.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def start_minfer(path: str, threads: int, n: int, port: int, backend: str):
    import minfer  # the server runs the minfer this script imports (installed, or python/ on the path)

    env = dict(os.environ, PYTHONPATH=str(Path(minfer.__file__).resolve().parents[1]) + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "minfer.serve", "--model", path, "--port", str(port),
                             "--threads", str(threads), "--max-sequences", str(max(n, 1)), "--ctx", "8192",
                             "--backend", backend], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_llama(exe: str, path: str, threads: int, n: int, port: int, extra: list[str]):
    return subprocess.Popen([exe, "-m", path, "--port", str(port), "--host", "127.0.0.1", "-np", str(max(n, 1)),
                             "-c", "8192", "-t", str(threads), "--no-webui", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stream(client: httpx.Client, url: str, prompt: str, tokens: int) -> tuple[str, float, list[float]]:
    """(text, seconds to the first token, gaps between later tokens)."""
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    text, ttft, gaps, last = [], None, [], None
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])
            if not ch.get("choices") or not ch["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            elif last is not None:
                gaps.append(now - last)
            last = now
            text.append(ch["choices"][0]["text"])
    return "".join(text), ttft or 0.0, gaps


def rounds(url: str, clients: list[int], tokens: int) -> dict:
    # one client for all streams (a client apiece costs the benchmark's own process ~20 ms of setup under the
    # GIL each, which showed up as the server's time to first token), a fresh connection a request (llama-server
    # closes a kept-alive connection after a few requests, racing the next one)
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=max(clients) + 4,
                                                           max_keepalive_connections=0))
    def prompts(tag: str, n: int) -> list[str]:
        return [f"{tag}{i}: write a short story about a robot who" for i in range(n)]  # no prefix shared

    out, results = {}, {}
    for n in clients:
        # a warm-up round (plans, graphs) on other prompts, then the measured one on prompts neither server has
        # seen (a server's prompt cache must not answer them)
        for tag in (f"w{n}", f"m{n}"):
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(n) as ex:
                res = list(ex.map(lambda p: stream(client, url, p, tokens), prompts(tag, n)))
            wall = time.perf_counter() - t0
        results[n] = res
        ttft = np.array([r[1] for r in res])
        gaps = np.array([g for r in res for g in r[2]] or [0.0])
        out[n] = dict(tps=n * tokens / wall, ttft50=np.percentile(ttft, 50) * 1e3, ttft99=np.percentile(ttft, 99) * 1e3,
                      itl50=np.percentile(gaps, 50) * 1e3, itl99=np.percentile(gaps, 99) * 1e3)
    for n in clients:  # each stream against its prompt alone, after the rounds
        out[n]["same"] = sum(r[0] == stream(client, url, p, tokens)[0] for r, p in zip(results[n], prompts(f"m{n}", n)))
    client.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--llama-args", default="", help="extra llama-server arguments, e.g. '-ngl 99 -fa on'")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "python"))
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if a.model.startswith("layout:"):
        from bench_batched import LAYOUTS
        from conftest import layout_model
        path = str(layout_model(LAYOUTS[a.model[7:]]))
    else:
        from minfer import engine
        path = engine.resolve(a.model)
    clients = [int(c) for c in a.clients.split(",")]
    results = {}
    servers = [("minfer", lambda n, port: start_minfer(path, a.threads, n, port, a.backend))]
    if os.environ.get("LLAMA_SERVER"):
        servers.append(("llama.cpp", lambda n, port: start_llama(os.environ["LLAMA_SERVER"], path, a.threads, n, port,
                                                                 a.llama_args.split())))
    for name, launch in servers:
        port = free_port()
        proc = launch(max(clients), port)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            results[name] = rounds(f"http://127.0.0.1:{port}", clients, a.tokens)
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"# {path}, {a.threads} threads, {a.tokens} tokens a stream, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'server':>9} {'N':>3} | {'tok/s':>7} {'TTFT p50':>9} {'p99':>7} | {'ITL p50':>8} {'p99':>7} | solo text")
    for name, res in results.items():
        for n, r in res.items():
            print(f"{name:>9} {n:>3} | {r['tps']:7.1f} {r['ttft50']:8.1f}ms {r['ttft99']:6.1f}ms | "
                  f"{r['itl50']:7.1f}ms {r['itl99']:6.1f}ms | {r['same']}/{n}")
    if "llama.cpp" in results:
        for n in clients:
            m, l = results["minfer"][n], results["llama.cpp"][n]
            print(f"N={n}: tok/s {m['tps'] / l['tps']:.2f}x, TTFT p99 {m['ttft99'] / l['ttft99']:.2f}x of llama-server")


if __name__ == "__main__":
    main()
