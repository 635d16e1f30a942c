"""End-to-end speed: prefill, decode, time to first token, peak memory.

    python benchmarks/bench_e2e.py                      # the three real models, 2 threads
    python benchmarks/bench_e2e.py --llama-bench /path/to/llama-bench --reps 3
    python benchmarks/bench_e2e.py --kernel cpu.attention=f32     # an A/B run against a forced kernel

For each model and repetition, minfer runs in a fresh process (so peak RSS is
its own) and, with --llama-bench, llama-bench runs on the same file with
the same threads, prompt length and generation length, alternating with it.
Prints medians, the spread (min-max), minfer/llama.cpp ratios and the decode
bandwidth (bytes read per token x tokens/s), and writes --json.

Measurements (minfer):
  prefill  : one eval of an n_prompt-token prompt (token ids fixed, seeded)
  decode   : n_gen single-token steps after that prompt, greedy (Python loop)
  ttft     : a 16-token prompt: eval + argmax, in a fresh session
  load     : open to first eval ready (mmap: no weight copies)
  rss_peak : the process's peak resident set (ru_maxrss)
  loop %   : share of LLM.generate's decode time outside Session.eval (sampler, detokenizer, Python)
  probe    : the streaming-read probe (bench_bandwidth.py's) in each rep's process, seconds after its decode;
             "% of probe" is the median over reps of decode GB/s / that rep's probe
llama.cpp: pp = `-p N -n 0`, tg = `-p 0 -n G -d N` (decode after an N-token context, like minfer's),
TTFT = 16 / (pp of `-p 16`).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def worker(name: str, threads: int, n_prompt: int, n_gen: int, kernels: list[str]) -> dict:
    import numpy as np

    from minfer import engine, gguf

    for kv in kernels:
        engine.force_kernel(*kv.split("=", 1))
    path = engine.resolve(name)
    t0 = time.perf_counter()
    model = engine.Model(path)
    sess = engine.Session(model, threads=threads, n_ctx=n_prompt + n_gen + 16)
    load = time.perf_counter() - t0
    vocab = model.config["n_vocab"]
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, min(vocab, 30000), size=n_prompt).astype(np.int32)

    sess.eval(prompt[:8], 0)  # warm-up: builds and runs a small plan, touches the pages once
    t0 = time.perf_counter()
    logits = sess.eval(prompt, 0)
    prefill = time.perf_counter() - t0
    tok = int(logits[-1].argmax())
    t0 = time.perf_counter()
    for k in range(n_gen):
        tok = int(sess.eval(np.array([tok], np.int32), n_prompt + k)[-1].argmax())
    decode = time.perf_counter() - t0

    s2 = engine.Session(model, threads=threads, n_ctx=64)
    s2.eval(prompt[:4], 0)  # plans are per session: build the 16-token one's neighbours first
    t0 = time.perf_counter()
    int(s2.eval(prompt[:16], 0)[-1].argmax())
    ttft = time.perf_counter() - t0

    rss_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the second model below
    # the Python decode loop's own cost: LLM.generate (sampler, detokenizer, stop strings) around the
    # same evals, greedy, end-of-generation tokens masked so it runs its full length
    from minfer import LLM
    llm = LLM(path, threads=threads, n_ctx=128 + 16)
    no_eog = {t: -1e9 for t in llm.tokenizer.special.eog}
    out = llm.generate(prompt[:64].tolist(), max_tokens=64, temperature=0, logit_bias=no_eog)
    loop_overhead = out.metrics.decode_overhead
    llm.close()

    # the machine's read bandwidth seconds after the decode, in the same process and thread count (after
    # ru_maxrss: its 512 MiB are not the model's): the VM's memory speed moves by 20 % within an hour, so a
    # share of a ceiling measured at another minute misleads
    from minfer import _minfer, quants
    probe = _minfer.read_bandwidth_gbps(512 << 20, 3, quants.ThreadPool(threads))
    f = gguf.open(path)
    weights = sum(t.nbytes for t in f.tensors.values())
    emb = f.tensors["token_embd.weight"].nbytes
    tied = "output.weight" not in f.tensors
    per_token = weights - (0 if tied else emb)  # every weight but the embedding table is read per token
    cfg = model.config
    kv_per_pos = 2 * cfg["n_layer"] * cfg["n_head_kv"] * cfg["head_dim"] * 2  # f16 K and V
    kv_bytes = kv_per_pos * (n_prompt + n_gen / 2)  # mean context over the decode
    return dict(model=name, threads=threads, n_prompt=n_prompt, n_gen=n_gen, load_s=load,
                prefill_tps=n_prompt / prefill, decode_tps=n_gen / decode, ttft_s=ttft,
                rss_peak_mb=rss_peak_mb,
                bytes_per_token=per_token + kv_bytes, weight_bytes_per_token=per_token,
                path=path, graph_builds=sess.graph_builds, loop_overhead=loop_overhead, probe_gbps=probe)


def run_llama_bench(binary: str, path: str, threads: int, n_prompt: int, n_gen: int) -> dict:
    # prefill: an n_prompt-token prompt; decode: n_gen tokens after an n_prompt-token context
    # (-d, as minfer's decode runs after its prompt), not from an empty cache
    def bench(*args):
        out = subprocess.run([binary, "-m", path, "-t", str(threads), *args, "-r", "1", "-o", "json"],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)
    pp = bench("-p", str(n_prompt), "-n", "0")
    tg = bench("-p", "0", "-n", str(n_gen), "-d", str(n_prompt))
    p16 = bench("-p", "16", "-n", "0")  # time to first token ~ a 16-token prompt's eval
    return dict(prefill_tps=pp[0]["avg_ts"], decode_tps=tg[0]["avg_ts"], ttft_s=16 / p16[0]["avg_ts"],
                commit=pp[0].get("build_commit", "?"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="bench_e2e.json")
    ap.add_argument("--llama-bench", default="", help="llama.cpp's llama-bench, run on the same files for the ratios")
    ap.add_argument("--kernel", action="append", default=[], metavar="CHOICE=VALUE",
                    help="force a kernel choice (minfer.engine.kernel_choices()) for an A/B run; repeatable")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.threads, a.prompt, a.gen, a.kernel)))
        return
    llama = a.llama_bench
    results = []
    for name in a.models.split(","):
        runs, lruns = [], []
        for _ in range(a.reps):
            out = subprocess.run([sys.executable, __file__, "--worker", name, "--threads", str(a.threads),
                                  "--prompt", str(a.prompt), "--gen", str(a.gen),
                                  *[f"--kernel={k}" for k in a.kernel]], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(out.stderr)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if llama:
                lruns.append(run_llama_bench(llama, runs[-1]["path"], a.threads, a.prompt, a.gen))
        med = lambda key, rs: statistics.median(r[key] for r in rs)
        spread = lambda key, rs: (min(r[key] for r in rs), max(r[key] for r in rs))
        row = {"model": name, "runs": runs, "llama": lruns}
        for k in ("prefill_tps", "decode_tps", "ttft_s", "load_s", "rss_peak_mb", "loop_overhead"):
            row[k] = med(k, runs)
            row[k + "_spread"] = spread(k, runs)
        row["decode_gbps"] = row["decode_tps"] * runs[0]["bytes_per_token"] / 1e9
        # each rep's decode bandwidth against the probe read right after it, then the median of those shares
        row["probe_gbps"] = med("probe_gbps", runs)
        row["decode_share"] = statistics.median(r["decode_tps"] * r["bytes_per_token"] / 1e9 / r["probe_gbps"] for r in runs)
        if lruns:
            for k in ("prefill_tps", "decode_tps", "ttft_s"):
                row["llama_" + k] = med(k, lruns)
                row[k + "_ratio"] = row[k] / row["llama_" + k]
            row["llama_commit"] = lruns[0]["commit"]
        results.append(row)
    print(f"\nthreads={a.threads} prompt={a.prompt} gen={a.gen} reps={a.reps}")
    hdr = ("| model | prefill tok/s | decode tok/s | decode GB/s | probe GB/s | % of probe | TTFT (16) ms | load s |"
           " peak RSS MB | loop % |")
    if llama:
        hdr += " llama pp | llama tg | llama TTFT ms | pp ratio | tg ratio |"
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in results:
        line = (f"| {r['model']} | {r['prefill_tps']:.1f} ({r['prefill_tps_spread'][0]:.1f}-{r['prefill_tps_spread'][1]:.1f})"
                f" | {r['decode_tps']:.1f} ({r['decode_tps_spread'][0]:.1f}-{r['decode_tps_spread'][1]:.1f})"
                f" | {r['decode_gbps']:.1f} | {r['probe_gbps']:.1f} | {r['decode_share'] * 100:.0f} | {r['ttft_s'] * 1e3:.0f} | {r['load_s']:.2f} | {r['rss_peak_mb']:.0f} |"
                f" {r['loop_overhead'] * 100:.1f} |")
        if llama:
            line += (f" {r['llama_prefill_tps']:.1f} | {r['llama_decode_tps']:.1f} | {r['llama_ttft_s'] * 1e3:.0f} |"
                     f" {r['prefill_tps_ratio']:.2f} | {r['decode_tps_ratio']:.2f} |")
        print(line)
    json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
