"""Many sequences at once, beside llama.cpp's llama-batched-bench on the same file and threads.

    python benchmarks/bench_batched.py -m qwen2.5-coder-0.5b -t 2 --npp 128 --ntg 64 --npl 1,2,4,8,16 \
        --llama-batched-bench /path/to/llama-batched-bench [--e2e 8]
    python benchmarks/bench_batched.py -m layout:7b --device cuda --npp 512 --ntg 128 --npl 1,4,16,64 \
        --llama-batched-bench /path/to/llama-batched-bench --llama-args "-ngl 99 -fa on"

A model is a path, a name from minfer.hub, or layout:0.5b|1.5b|7b (the real models' layouts with random
weights, as bench_cuda.py).

For each batch size B, as llama-batched-bench measures it: B prompts of P tokens are read in steps of at
most 512 tokens (S_PP: prompt tokens/s), then T steps of one token per sequence (S_TG: B*T / their time);
S is all B*(P+T) tokens over all the time.  minfer runs the batch step (BatchRunner) directly, greedy, its
KV in one pool; where the device chains greedy steps (CUDA) the decode runs in chains of the engine's length
(--chain 1: step by step, a host turn between every two steps as llama-batched-bench has).  The decode line
also prints the step's bytes (the weights once plus every sequence's KV) over its time, against the machine's
streaming-read rate (`roof`, the GPU's copy rate on the GPU), and at the end where a decode step's host time
went (BatchRunner.step_times: preparing, enqueuing, reading back -- on a GPU the wait -- and the rest, this
script's own loop).

--e2e B: B requests sent at once from B threads through LLM(max_sequences=B) (tokenizing, scheduling,
sampling, detokenizing included): generated tokens over the whole time, beside llama.cpp's B*T / T for
the same B.  --prefix N: 16 requests sharing an N-token system prompt, each sent after the previous one's
first token, to minfer.batch.Engine: the time to first token of the 1st (computes the prefix) against the
16th (finds it cached).  --profile B: milliseconds per decode step by op at B sequences.  --overhead B:
the engine's own time a step (scheduling, the step's arrays, sampling, streaming) with B greedy sequences of
the tiny synthetic model, or of -m's model on --device (--temp T: sampled; --stand-in MS: steps that sleep
MS and make up their tokens, as a GPU host sees the engine), its steps timed apart: the host's share of a step.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
LAYOUTS = {"0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m", "1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m",
           "7b": "deepseek-r1-distill-qwen-7b-q4_k_m"}

from minfer import _minfer, batch, engine, gguf, quants

UBATCH = 512


def weight_bytes(path: str) -> int:
    with gguf.open(path) as f:
        return sum(t.data.nbytes for t in f.tensors.values())


def kv_bytes_per_token(model) -> int:
    c = model.config
    return 2 * c["n_layer"] * c["n_head_kv"] * c["head_dim"] * 2  # f16 K and V


def run_minfer(runner, P: int, T: int, B: int, after_prompts=lambda: None, chain: int = 1) -> dict:
    vocab = runner.n_vocab
    rng = np.random.default_rng(B)
    prompts = rng.integers(100, min(vocab, 30000), size=(B, P)).astype(np.int32)
    bs, mb = runner.block_size, runner.max_blocks
    per_seq = -(-(P + T) // bs)
    tables = np.zeros((B, mb), np.int32)
    for s in range(B):
        tables[s, :per_seq] = np.arange(s * per_seq, (s + 1) * per_seq)
    # prompts: rows packed into steps of <= UBATCH tokens (a sequence may span two steps)
    t0 = time.perf_counter()
    done = [0] * B
    s = 0
    while s < B:
        toks, pos, lens, seqs = [], [], [], []
        room = UBATCH
        while s < B and room > 0:
            n = min(P - done[s], room)
            toks.extend(prompts[s, done[s]:done[s] + n])
            pos.extend(range(done[s], done[s] + n))
            lens.append(n)
            seqs.append(s)
            done[s] += n
            room -= n
            if done[s] == P:
                s += 1
        last = runner.step_greedy(np.array(toks, np.int32), np.array(pos, np.int32), np.array(lens, np.int32),
                                  tables[seqs])
    t_pp = time.perf_counter() - t0
    after_prompts()
    nxt = np.full(B, int(last[-1]), np.int32)
    ones = np.ones(B, np.int32)
    h0 = runner.step_times()
    t0 = time.perf_counter()
    k = 0
    while k < T:  # chains of greedy steps where the device runs them (as the engine does), else step by step
        m = min(chain, T - k)
        if m > 1:
            nxt = runner.step_greedy_chain(nxt, np.full(B, P + k, np.int32), tables, m)[-1]
        else:
            nxt = runner.step_greedy(nxt, np.full(B, P + k, np.int32), ones, tables)
        k += m
    t_tg = time.perf_counter() - t0
    h1 = runner.step_times()
    host = {k: (h1[k] - h0[k]) / T for k in ("prepare_s", "launch_s", "read_s")}  # a decode step's, seconds
    return dict(t_pp=t_pp, t_tg=t_tg, s_pp=B * P / t_pp, s_tg=B * T / t_tg, s=B * (P + T) / (t_pp + t_tg), host=host)


def run_llama(exe: str, path: str, threads: int, P: int, T: int, npl: list[int], ctx: int, extra: list[str]) -> dict:
    cmd = [exe, "-m", path, "-c", str(ctx), "-b", str(UBATCH), "-ub", str(UBATCH), "-t", str(threads),
           "-npp", str(P), "-ntg", str(T), "-npl", ",".join(map(str, npl))] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[0] or "x"):
            pp, tg, b, _, t_pp, s_pp, t_tg, s_tg, t, s = cells
            rows[int(b)] = dict(t_pp=float(t_pp), s_pp=float(s_pp), t_tg=float(t_tg), s_tg=float(s_tg), t=float(t),
                                s=float(s))
    return rows


def run_e2e(path: str, threads: int, P: int, T: int, B: int, device: str) -> float:
    from minfer import LLM

    with LLM(path, threads=threads, backend=device, max_sequences=B, n_ctx=P + T + 16) as llm:
        rng = np.random.default_rng(1)
        prompts = [list(map(int, rng.integers(100, 30000, size=P))) for _ in range(B)]
        no_eog = {t: -1e9 for t in llm.tokenizer.special.eog}
        llm.generate(prompts[0][:8], max_tokens=2)  # warm-up
        outs = [None] * B

        def call(i):
            outs[i] = llm.generate(prompts[i], max_tokens=T, logit_bias=no_eog)
        ths = [threading.Thread(target=call, args=(i,)) for i in range(B)]
        t0 = time.perf_counter()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        dt = time.perf_counter() - t0
    assert all(len(o.tokens) == T for o in outs)
    return B * T / dt


def profile(model, a, P: int, T: int) -> None:
    """Milliseconds per decode step by op (MINFER_OP_PROFILE: each node synchronized, so no overlap)."""
    import minfer

    minfer.set_setting("MINFER_OP_PROFILE", "1")
    B = a.profile
    runner = _minfer.BatchRunner(model, n_ctx=P + T + 16, threads=a.threads, device=a.device,
                                 kv_tokens=B * (P + T + 32), block_size=32)

    def snap():
        return {k: v[0] for k, v in runner.op_profile().items()}
    before = {}
    run_minfer(runner, P, T, B, after_prompts=lambda: before.update(snap()))  # decode's share: the difference
    after = snap()
    rows = sorted(((after[k] - before.get(k, 0.0)) / T * 1e3, k) for k in after)
    print(f"# per decode step at B={B}: {sum(r[0] for r in rows):.2f} ms")
    for ms, k in reversed(rows):
        if ms > 0.005:
            print(f"  {k:14s} {ms:8.3f} ms")


def engine_overhead(B: int, threads: int, T: int = 64, temperature: float = 0.0, path: str = "",
                    device: str = "cpu", stand_in_ms: float = 0.0, chain: int = 0) -> tuple[float, float, str, float]:
    """(the engine's own ms a step, the ms between two steps and how they were summed, the steps' ms) for B sequences of 16 prompt
    tokens and T tokens each, greedy or sampled at `temperature` with llama.cpp's default cuts (top_k 40, top_p
    0.95, min_p 0.05), on the tiny synthetic model (152k tokens) or the model at `path` on `device`.  Only the
    time around the steps is the engine's, the samplers' softmaxes included; the first figure also counts the
    requests' submission and their results (once a request, spread over its steps), the second only the
    engine's work from one step's end to the next one's start: the time a device waits between steps.
    stand_in_ms > 0: each step sleeps that long and returns made-up tokens (or best logits) instead of running
    the model -- the engine as a GPU host runs it, its caches not flushed by CPU steps in between.  chain: greedy
    steps a chain (default: the engine's choice); with chains the time between steps is the mean (a chain's steps
    have none between them), else the median."""
    from conftest import synthetic_model
    from minfer.batch import Engine

    rng = np.random.default_rng(0)
    path = path or str(synthetic_model("qwen2-tiny-f32"))
    with Engine(path, threads=threads, backend=device, max_sequences=B, n_ctx=256) as eng:
        prompts = [list(map(int, rng.integers(100, 30000, size=16))) for _ in range(B)]
        if chain:
            eng._chain_steps = chain
        eng.generate_batch(prompts[:2], max_tokens=4)  # warm-up
        runner, in_steps, marks = eng._runner, [0.0], []
        best_vals = -np.sort(-rng.standard_normal((B, runner.best_max)).astype(np.float32), axis=1)
        best_ids = rng.integers(100, 30000, size=(B, runner.best_max)).astype(np.int32)

        def stand_in(name, tokens, positions, seq_lens, *a, k=0, **kw):
            if name == "step_greedy_chain":  # (tokens, positions, tables, steps): steps made-up steps
                steps = a[0]
                time.sleep(steps * stand_in_ms / 1e3)
                out = [tokens]
                for _ in range(steps):
                    out.append((out[-1] * 7 + 13) % 30000 + 100)
                return np.array(out[1:], np.int32)
            time.sleep(stand_in_ms / 1e3)
            n = len(seq_lens)
            if name == "step_best":
                return best_vals[:n, :k].copy(), best_ids[:n, :k].copy()
            last = tokens[np.cumsum(seq_lens) - 1]
            if name == "step_greedy":
                return (last * 7 + 13) % 30000 + 100
            return rng.standard_normal((n, eng.n_vocab)).astype(np.float32)

        class Timed:  # the runner with its steps' time counted
            def __getattr__(self, k):
                return getattr(runner, k)

            def timed(self, name, *a, steps=1, **kw):
                t = time.perf_counter()
                out = stand_in(name, *a, **kw) if stand_in_ms else getattr(runner, name)(*a, **kw)
                t1 = time.perf_counter()
                for i in range(steps):  # a chain's steps follow each other with nothing in between
                    marks.append((t + (t1 - t) * i / steps, t + (t1 - t) * (i + 1) / steps))
                in_steps[0] += t1 - t
                return out

            def step_greedy_chain(self, *a, **kw):
                return self.timed("step_greedy_chain", *a, steps=a[3], **kw)

            def step_greedy(self, *a, **kw):
                return self.timed("step_greedy", *a, **kw)

            def step(self, *a, **kw):
                return self.timed("step", *a, **kw)

            def step_best(self, *a, **kw):
                return self.timed("step_best", *a, **kw)
        eng._runner = Timed()
        sampling = dict(temperature=temperature, top_k=40, top_p=0.95, min_p=0.05, seed=1) if temperature else {}
        s0, t0 = eng.steps, time.perf_counter()
        eng.generate_batch(prompts, max_tokens=T, **sampling)
        dt, n = time.perf_counter() - t0, eng.steps - s0
    gaps = [b[0] - a[1] for a, b in zip(marks, marks[1:])]
    chained = eng._chain_steps > 1
    between = np.mean(gaps) if chained else np.median(gaps)
    return (dt - in_steps[0]) / n * 1e3, between * 1e3, "mean" if chained else "median", in_steps[0] / n * 1e3


def run_prefix(path: str, threads: int, n_prefix: int, device: str, n_req: int = 16) -> list:
    from minfer.batch import Engine

    rng = np.random.default_rng(2)
    system = list(map(int, rng.integers(100, 30000, size=n_prefix)))
    with Engine(path, threads=threads, backend=device, max_sequences=n_req, n_ctx=n_prefix + 64) as eng:
        eng.submit(list(map(int, rng.integers(100, 30000, size=8))), max_tokens=2).result()  # warm-up
        ttft = []
        for i in range(n_req):  # each waits for the previous one's first token: the prefix is written by then
            h = eng.submit(system + list(map(int, rng.integers(100, 30000, size=12))), max_tokens=8)
            next(iter(h), None)
            ttft.append((h.metrics.ttft_s, h.metrics.cached_tokens))
        return ttft


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None, help="default qwen2.5-coder-0.5b (--overhead: the tiny model)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--npp", type=int, default=128)
    ap.add_argument("--ntg", type=int, default=64)
    ap.add_argument("--npl", default="1,2,4,8,16")
    ap.add_argument("--llama-batched-bench", default="")
    ap.add_argument("--llama-args", default="", help="extra llama-batched-bench arguments, e.g. '-ngl 99 -fa on'")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--e2e", type=int, default=0, help="also the end-to-end LLM run at this B")
    ap.add_argument("--profile", type=int, default=0, help="only the per-op time of a decode step at this B")
    ap.add_argument("--prefix", type=int, default=0, help="only the prefix-caching run, with this system prompt")
    ap.add_argument("--overhead", type=int, default=0, help="only the engine's own time a step at this B")
    ap.add_argument("--temp", type=float, default=0.0, help="--overhead's sequences sample at this temperature")
    ap.add_argument("--stand-in", type=float, default=0.0,
                    help="--overhead: steps sleep this many ms instead of running the model (a GPU host's view)")
    ap.add_argument("--chain", type=int, default=0,
                    help="greedy decode steps a chain (default: the engine's where the device chains, else 1)")
    ap.add_argument("--kernel", action="append", default=[], metavar="CHOICE=VALUE",
                    help="force a kernel choice (minfer.engine.kernel_choices()) for an A/B run; repeatable")
    a = ap.parse_args()
    for kv in a.kernel:
        engine.force_kernel(*kv.split("=", 1))
    def model_path(name: str) -> str:
        if name.startswith("layout:"):
            from conftest import layout_model

            return str(layout_model(LAYOUTS[name[7:]]))
        return engine.resolve(name)
    if a.overhead:  # the tiny model unless a model is named
        model = model_path(a.model) if a.model else ""
        own, between, how_summed, steps = engine_overhead(a.overhead, a.threads, temperature=a.temp, path=model, device=a.device,
                                              stand_in_ms=a.stand_in, chain=a.chain)
        how = f"temperature {a.temp}, top_k 40, top_p 0.95, min_p 0.05" if a.temp else "greedy"
        what = f"a {a.stand_in:g} ms stand-in" if a.stand_in else Path(model).name if model else "the tiny model"
        print(f"# engine at B={a.overhead} ({how}), beside {steps:.2f} ms in the steps of {what}: "
              f"{between:.3f} ms between steps ({how_summed}; {100 * between / steps:.1f} %), {own:.3f} ms a step of its "
              f"own with the requests' submission and results ({100 * own / steps:.1f} %, "
              f"{own / a.overhead * 1e3:.1f} us a sequence)")
        return
    a.model = a.model or "qwen2.5-coder-0.5b"
    path = model_path(a.model)
    npl = [int(x) for x in a.npl.split(",")]
    P, T = a.npp, a.ntg
    ctx = max(npl) * (P + T) + 64
    print(f"# {path}, {a.threads} threads, P={P} T={T}, {time.strftime('%Y-%m-%d %H:%M')}")
    llama = run_llama(a.llama_batched_bench, path, a.threads, P, T, npl, ctx, a.llama_args.split()) \
        if a.llama_batched_bench else {}
    model = engine.Model(path)
    if a.profile:
        return profile(model, a, P, T)
    if a.prefix:
        t = run_prefix(path, a.threads, a.prefix, a.device)
        print(f"# 16 requests sharing a {a.prefix}-token prefix: time to first token (cached tokens)")
        for i in (0, 1, len(t) - 1):
            print(f"  request {i + 1:2d}: {t[i][0] * 1e3:8.1f} ms  ({t[i][1]} cached)")
        print(f"  16th / 1st: {t[-1][0] / t[0][0]:.2f}")
        return
    wbytes = weight_bytes(path)
    kvt = kv_bytes_per_token(model)
    roof = _minfer.read_bandwidth_gbps(512 << 20, 3, quants.ThreadPool(a.threads)) if a.device == "cpu" \
        else _minfer.cuda_copy_bandwidth(1 << 31, 20) / 1e9
    runner = _minfer.BatchRunner(model, n_ctx=P + T + 16, threads=a.threads, device=a.device,
                                 kv_tokens=max(npl) * (P + T + 32), block_size=32)
    chain = a.chain if a.chain else batch.CHAIN_STEPS if runner.chains else 1
    print(f"# decode: {'chains of %d greedy steps (as the engine runs them here)' % chain if chain > 1 else 'step by step'}")
    hdr = f"{'B':>3} | {'S_PP':>8} {'S_TG':>8} {'S':>8} | {'llama S_PP':>10} {'S_TG':>8} {'S':>8} | " \
          f"{'PP x':>5} {'TG x':>5} {'S x':>5} | decode GB/s  roof"
    print(hdr)
    print("-" * len(hdr))
    results = {}
    for B in npl:
        r = run_minfer(runner, P, T, B, chain=chain)
        results[B] = r
        step = r["t_tg"] / T
        gbs = (wbytes + B * (P + T / 2) * kvt) / step / 1e9
        l = llama.get(B)
        ratio = (lambda k: f"{r[k] / l[k]:5.2f}") if l else (lambda k: "    -")
        ls = f"{l['s_pp']:10.1f} {l['s_tg']:8.1f} {l['s']:8.1f}" if l else f"{'-':>10} {'-':>8} {'-':>8}"
        rf = f"{gbs / roof:5.0%}" if roof else "   -"
        print(f"{B:3d} | {r['s_pp']:8.1f} {r['s_tg']:8.1f} {r['s']:8.1f} | {ls} | {ratio('s_pp')} {ratio('s_tg')} "
              f"{ratio('s')} | {gbs:8.1f}  {rf}")
    if roof:
        print(f"# roof: {'streaming read' if a.device == 'cpu' else 'device copy'} {roof:.1f} GB/s; weights {wbytes / 1e6:.0f} MB, KV {kvt / 1024:.1f} KiB/token")
    print("# a decode step on the host, ms: prepare (check, inputs) + launch (enqueue; CPU: run) + read back "
          "(GPU: the wait) = in the runner; the rest of the wall time is this script's")
    for B, r in results.items():
        h, wall = r["host"], r["t_tg"] / T
        inside = sum(h.values())
        print(f"#   B={B:<3d} {h['prepare_s'] * 1e3:.3f} + {h['launch_s'] * 1e3:.3f} + {h['read_s'] * 1e3:.3f} = "
              f"{inside * 1e3:.3f} of {wall * 1e3:.3f} (outside {(wall - inside) * 1e3:.3f})")
    if a.e2e:
        B = a.e2e
        tps = run_e2e(path, a.threads, P, T, B, a.device)
        l = llama.get(B)
        ref = B * T / l["t"] if l else None
        print(f"# end to end, B={B} requests from {B} threads through LLM: {tps:.1f} generated tok/s" +
              (f"; llama.cpp B*T/T = {ref:.1f}: {tps / ref:.2f}x" if ref else ""))


if __name__ == "__main__":
    main()
