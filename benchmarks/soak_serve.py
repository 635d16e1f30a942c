"""A soak of `python -m minfer.serve`: requests of random lengths and sampling, a third of them abandoned
mid-stream by their clients, for a time or a count; none may be lost, the KV blocks must all come back, and
the server's memory at the end must be within 5 % of its memory after a warm-up.

    python benchmarks/soak_serve.py --minutes 10                  # the tiny synthetic model, 16 clients
    python benchmarks/soak_serve.py -m qwen2.5-coder-0.5b --minutes 10

tests/test_serve.py runs a short one (soak()) in CI.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import random
import sys
import time
from pathlib import Path

import httpx


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def one(client: httpx.Client, url: str, i: int, rnd: random.Random) -> str:
    """A streamed request: "done" ([DONE] came), "left" (abandoned on purpose) or "lost"."""
    body = {"prompt": f"req {i} " * rnd.randint(1, 20), "max_tokens": rnd.randint(1, 40), "temperature": 0.8,
            "seed": i, "stream": True}
    got = 0
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                return "done"
            if line.startswith("data:"):
                got += 1
                if i % 3 == 0 and got > 2:
                    return "left"
    return "lost"


def metrics(client: httpx.Client, url: str) -> dict:
    out = {}
    for line in client.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def soak(url: str, pid: int, requests: int | None = None, seconds: float | None = None, warmup: int = 40,
         workers: int = 16, seed: int = 0) -> dict:
    """Runs the soak against a server at `url` (process `pid`); returns the outcomes, the RSS after the
    warm-up and at the end (KiB), and the running requests and KV blocks used once it has settled."""
    rnd = random.Random(seed)
    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=workers + 4))
    counter = itertools.count()
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda i: one(client, url, i, random.Random(i)), range(warmup)))
        time.sleep(0.5)
        rss0 = rss_kib(pid)
        t_end = time.monotonic() + seconds if seconds else None

        def worker(_):
            outs = []
            while True:
                i = warmup + next(counter)
                if (requests is not None and i >= warmup + requests) or (t_end and time.monotonic() > t_end):
                    return outs
                outs.append(one(client, url, i, random.Random(rnd.random() + i)))
        outcomes = [o for outs in ex.map(worker, range(workers)) for o in outs]
    deadline = time.monotonic() + 10
    m = metrics(client, url)
    while m["minfer_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
        m = metrics(client, url)
    client.close()
    return dict(outcomes=outcomes, rss0=rss0, rss1=rss_kib(pid), running=m["minfer_requests_running"],
                blocks_used=m["minfer_kv_blocks_used"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="", help="a model name or path (default: the tiny synthetic model)")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=400,
                    help="requests before the memory reference (the plans, caches and heap reach their size)")
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "tests"), str(root / "python")]
    import test_serve  # the tests' server launcher

    args = ["--max-sequences", str(a.clients)]
    srv = test_serve.start(*args, model=a.model or None)
    try:
        t0 = time.monotonic()
        r = soak(srv.url, srv.proc.pid, seconds=a.minutes * 60, workers=a.clients, warmup=a.warmup)
        n = {k: r["outcomes"].count(k) for k in ("done", "left", "lost")}
        print(f"# soak {a.minutes} min, {a.clients} clients, {len(r['outcomes'])} requests in "
              f"{time.monotonic() - t0:.0f} s: {n}")
        print(f"RSS after warm-up {r['rss0'] / 1024:.1f} MiB, at the end {r['rss1'] / 1024:.1f} MiB "
              f"({(r['rss1'] / r['rss0'] - 1) * 100:+.1f} %); running {r['running']:.0f}, KV blocks used "
              f"{r['blocks_used']:.0f}")
    finally:
        test_serve.stop(srv)


if __name__ == "__main__":
    main()
