"""CUDA end-to-end speed on the layouts of real models (issue 6).

    MINFER_SHARED=... python benchmarks/bench_cuda.py [--models 0.5b,1.5b,7b] [--llama-bench PATH] [--json out.json]
    ... bench_cuda.py --long --models 1.5b,7b --llama-bench PATH    # 16k and 32k contexts

Models: full-size files with the exact layouts of qwen2.5-coder-0.5b / -1.5b and
a 7B qwen2 (Q4_K_M mixes) and random weights, made from the headers in
../shared/fixtures/layouts (tests/conftest.layout_model).  With --llama-bench, llama.cpp's
llama-bench runs on the same files in the same call (-ngl 99 -fa 1: all layers on the GPU, flash
attention, CUDA graphs on) and the ratios are against it; without, no ratio is printed.

Measured (medians of --reps, after a warm-up of the same shape):
  pp N     prefill of an N-token prompt: one Session.eval
  tg @D    128 single-token greedy decode steps after a D-token context, one
           Session.eval_greedy call a step (argmax on the device, 4 bytes back, a host
           turn between steps: what llama-bench's tg does too)
  chain @D the same 128 steps as one Session.decode_greedy (minfer.engine.greedy's
           loop): token and position stay on the device, the host waits once
  tg+logits  tg@512 through the logits (600 KB back a step, argmax in numpy)
  tg+top-k   tg@512 sampled with llama.cpp's default chain from each step's 40 best (Session.eval_best,
           Sampler.sample_best: what LLM.generate runs for a top-k chain)
  GB/s     (weight bytes a decode step reads + KV bytes it reads) x tokens/s,
           against the device-to-device copy rate measured first
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

LAYOUTS = {
    "0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m",
    "7b": "deepseek-r1-distill-qwen-7b-q4_k_m",
}
# "-q8": the same layouts with every quantized matrix in Q8_0 (benchmarks/layout_q8_0.py);
# anchors.md has no llama.cpp numbers for these, so no ratio is printed for them.
LAYOUTS.update({k + "-q8": v for k, v in LAYOUTS.items()})


def run_llama_bench(binary: str, path: str, reps: int, *args) -> list:
    """llama-bench (all layers on the GPU, flash attention) on a file: avg tok/s of each test it runs."""
    import subprocess

    out = subprocess.run([binary, "-m", path, "-ngl", "99", "-fa", "1", "-r", str(reps), "-o", "json", *args],
                         capture_output=True, text=True, check=True)
    return [r["avg_ts"] for r in json.loads(out.stdout)]


def llama_bench(binary: str, path: str, reps: int) -> tuple:
    """llama.cpp on the same file: pp512, pp2048, tg128 after 512 and after 4096 tokens of context."""
    pp = run_llama_bench(binary, path, reps, "-p", "512,2048", "-n", "0")
    tg = run_llama_bench(binary, path, reps, "-p", "0", "-n", "128", "-d", "512,4096")
    return pp[0], pp[1], tg[0], tg[1]


def decode_bytes(model, path: str, depth: int) -> float:
    """Bytes one decode step reads: every weight but the embedding (one row of it
    is gathered; all of it when it is also the output matrix), plus the f16 KV
    cache up to `depth`."""
    import minfer

    c = model.config
    emb = minfer.gguf.open(path).tensors["token_embd.weight"].data.nbytes
    tied = c["output_weight"] == "token_embd.weight"
    weights = model.weight_bytes - (0 if tied else emb) + emb / c["n_vocab"]
    return weights + 2 * c["n_layer"] * depth * c["n_head_kv"] * c["head_dim"] * 2


def bench(name: str, reps: int, out: dict, decode_only: bool = False) -> None:
    import minfer._minfer as M
    from conftest import layout_model

    path = layout_model(LAYOUTS[name], q8_0=name.endswith("-q8"))
    t0 = time.perf_counter()
    model = M.Model(str(path))
    s = M.Session(model, n_ctx=4096 + 256, device="cuda")
    load = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    V = model.config["n_vocab"]
    r = {"load_s": load, "weight_bytes": model.weight_bytes}
    for n in () if decode_only else (512, 2048):
        prompt = rng.integers(0, V, n).astype(np.int32)
        s.eval(prompt, 0)  # warm-up: plan, scratch, first launches
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            s.eval(prompt, 0)
            ts.append(time.perf_counter() - t)
        r[f"pp{n}"] = n / statistics.median(ts)
    for depth in (512, 4096):
        prompt = rng.integers(0, V, depth).astype(np.int32)
        ts, tl, tc, tb = [], [], [], []
        for rep in range(reps + 1):
            s.eval(prompt, 0)
            tok, pos = 1, depth
            t = time.perf_counter()
            for _ in range(128):  # greedy on the device: 4 bytes back per token
                tok = s.eval_greedy(np.array([tok], np.int32), pos)
                pos += 1
            if rep:  # the first round captures the decode graph
                ts.append(time.perf_counter() - t)
            s.eval(prompt, 0)
            t = time.perf_counter()
            s.decode_greedy(1, depth, 128)
            if rep:
                tc.append(time.perf_counter() - t)
            if depth == 512 and not decode_only:  # the logits path (what a sampler needs): 600 KB back per token, argmax in numpy
                s.eval(prompt, 0)
                tok, pos = 1, depth
                t = time.perf_counter()
                for _ in range(128):
                    tok = int(np.argmax(s.eval(np.array([tok], np.int32), pos)[-1]))
                    pos += 1
                if rep:
                    tl.append(time.perf_counter() - t)
                # sampled with llama.cpp's default chain from the step's 40 best (Session.eval_best): LLM's path
                s.eval(prompt, 0)
                sampler = M.Sampler(V, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
                tok, pos = 1, depth
                t = time.perf_counter()
                for _ in range(128):
                    tok = sampler.sample_best(*s.eval_best(np.array([tok], np.int32), pos, 40))
                    pos += 1
                if rep:
                    tb.append(time.perf_counter() - t)
        tps = 128 / statistics.median(ts)
        r[f"tg@{depth}"] = tps
        if tl:
            r[f"tg_logits@{depth}"] = 128 / statistics.median(tl)
            r[f"tg_topk@{depth}"] = 128 / statistics.median(tb)
        r[f"chain@{depth}"] = 128 / statistics.median(tc)
        step_bytes = decode_bytes(model, str(path), depth + 64)
        r[f"gbps@{depth}"] = step_bytes * tps / 1e9
        r[f"chain_gbps@{depth}"] = step_bytes * r[f"chain@{depth}"] / 1e9
    out[name] = r


def long_context(name: str, reps: int, binary: str, copy_gbps: float) -> dict:
    """Prefill of 16,384- and 32,768-token prompts and 64 greedy decode steps after contexts that long, beside
    llama-bench `-p 16384,32768 -n 0` and `-p 0 -n 64 -d 16384,32768` on the same file.  A model trained on
    32,768 tokens decodes after 32,704 (its context holds no more); llama.cpp runs past it."""
    import minfer._minfer as M
    from conftest import layout_model

    path = str(layout_model(LAYOUTS[name], q8_0=name.endswith("-q8")))
    model = M.Model(path)
    n_ctx = min(model.config["n_ctx_train"], 32768 + 64)
    s = M.Session(model, n_ctx=n_ctx, device="cuda")
    rng = np.random.default_rng(0)
    V = model.config["n_vocab"]
    r = {}
    def seconds(run) -> float:  # median of reps runs after a warm-up
        ts = []
        for _ in range(reps + 1):
            t = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts[1:])

    for n in (16384, 32768):
        prompt = rng.integers(0, V, n).astype(np.int32)
        r[f"pp{n}"] = n / seconds(lambda: s.eval(prompt, 0))
        depth = min(n, n_ctx - 64)
        r[f"tg@{n}"] = 64 / seconds(lambda: s.decode_greedy(1, depth, 64))
        r[f"gbps@{n}"] = decode_bytes(model, path, depth + 32) * r[f"tg@{n}"] / 1e9
    for depth in (512, 4096):  # shallow decode in the same long cache (its kernels follow n_ctx, not depth)
        r[f"tg@{depth}"] = 64 / seconds(lambda: s.decode_greedy(1, depth, 64))
    if binary:
        pp = run_llama_bench(binary, path, reps, "-p", "16384,32768", "-n", "0")
        tg = run_llama_bench(binary, path, reps, "-p", "0", "-n", "64", "-d", "16384,32768")
        r["llama"] = {"pp16384": pp[0], "pp32768": pp[1], "tg@16384": tg[0], "tg@32768": tg[1]}
    l = r.get("llama", {})
    print(f"{name} long context: " + "  ".join(
        f"{k} {r[k]:.0f} tok/s" + (f" ({r[k] / l[k]:.2f}x llama.cpp)" if k in l else "") +
        (f", {r['gbps@' + k[3:]]:.0f} GB/s = {100 * r['gbps@' + k[3:]] / copy_gbps:.0f}% of copy" if k.startswith("tg") else "")
        for k in ("pp16384", "pp32768", "tg@16384", "tg@32768")) +
        f"  (the same cache at depth 512 / 4096: {r['tg@512']:.0f} / {r['tg@4096']:.0f} tok/s)")
    return r


def kernels() -> None:
    """Kernel-level rates at the 7B layout's largest shapes (ffn_down-like 3584 x 18944, ffn_up-like
    18944 x 3584), the 1.5B ffn_up shape (8960 x 1536) and a vocabulary-sized output."""
    import minfer._minfer as M

    rng = np.random.default_rng(0)
    for tname, t, bv, bb, n, k in (("q4_k", 12, 256, 144, 3584, 18944), ("q6_k", 14, 256, 210, 3584, 18944),
                                   ("q8_0", 8, 32, 34, 3584, 18944), ("q4_k", 12, 256, 144, 18944, 3584),
                                   ("q4_k", 12, 256, 144, 8960, 1536),
                                   ("q8_0", 8, 32, 34, 151936, 896)):
        w = rng.integers(0, 256, size=(n, k // bv * bb), dtype=np.uint8)
        w.reshape(n, k // bv, bb)[:, :, bb - 2 if t == 14 else 0:][:, :, :2] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)
        for rows in (1, 4):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            for path in ("f32", "q8"):
                _, sec = M.cuda_matmul(t, w, x, n, 50, path=path)
                print(f"matvec {path:3} {tname} {n}x{k} rows={rows}: {sec * 1e6:7.1f} us  {w.nbytes / sec / 1e9:6.0f} GB/s")
        for rows in (2, 4, 8, 16, 32, 64):  # a batch's decode step: int8 / bf16 tensor cores, else gemm_q
            x = rng.standard_normal((rows, k)).astype(np.float32)
            paths = ["mma", "bf16"] if t in (8, 12, 14) else ["gemm"]
            for path in paths:
                _, sec = M.cuda_matmul(t, w, x, n, 20, path=path)
                print(f"{path:6} {tname} {n}x{k} rows={rows}: {sec * 1e6:7.1f} us  {w.nbytes / sec / 1e9:6.0f} GB/s  "
                      f"{2 * rows * n * k / sec / 1e12:6.1f} TOP/s")
        if n < 100000:
            x = rng.standard_normal((2048, k)).astype(np.float32)
            _, sec = M.cuda_matmul(t, w, x, n, 5, path="gemm")
            print(f"gemm   {tname} 2048x{n}x{k}: {sec * 1e3:7.2f} ms  {2 * 2048 * n * k / sec / 1e12:6.0f} TFLOP/s")


def profile(name: str) -> None:
    """Per-op time (synchronized after every node) of a 2048-token prefill and 32 decode steps."""
    import os
    import subprocess

    code = ("import numpy as np, minfer._minfer as M, sys; sys.path.insert(0, 'tests'); from conftest import layout_model;"
            f"s = M.Session(M.Model(str(layout_model('{LAYOUTS[name]}'))), n_ctx=4096, device='cuda');"
            "p = np.arange(2048, dtype=np.int32) % 1000; s.eval(p, 0);"
            "[s.eval(np.array([5], np.int32), 2048 + i) for i in range(32)]")
    env = dict(os.environ, MINFER_OP_PROFILE="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    print(f"op profile, {name} layout, prefill 2048 + 32 decode steps:\n" + r.stderr[-2500:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.5b,1.5b,7b", help="any of 0.5b 1.5b 7b, and the same with -q8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--kernels", action="store_true", help="kernel-level matvec/GEMM rates first")
    ap.add_argument("--profile", default="", help="per-op profile of one layout (e.g. 1.5b)")
    ap.add_argument("--decode-only", action="store_true", help="only tg@512 and tg@4096 (A/B runs)")
    ap.add_argument("--llama-bench", default="", help="llama.cpp's llama-bench, run on the same files for the ratios")
    ap.add_argument("--long", action="store_true", help="16k and 32k prefill and decode (long_context) instead")
    ap.add_argument("--kernel", action="append", default=[], metavar="CHOICE=VALUE",
                    help="force a kernel choice (minfer.engine.kernel_choices()) for an A/B run; repeatable")
    a = ap.parse_args()
    import minfer._minfer as M

    for kv in a.kernel:
        M.force_kernel(*kv.split("=", 1))

    info = M.cuda_info()
    if not info["available"]:
        sys.exit(f"no CUDA device: {info['reason']}")
    if a.kernels:
        kernels()
    if a.profile:
        profile(a.profile)
    copy = M.cuda_copy_bandwidth(1 << 31, 20)
    out = {"device": info["name"], "copy_gbps": copy / 1e9}
    if a.long:
        out.update({name: long_context(name, a.reps, a.llama_bench, copy / 1e9) for name in a.models.split(",")})
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))
        return
    llama = {}
    for name in a.models.split(","):
        bench(name, a.reps, out, a.decode_only)
        if a.llama_bench and not a.decode_only:
            from conftest import layout_model

            path = str(layout_model(LAYOUTS[name], q8_0=name.endswith("-q8")))
            llama[name] = llama_bench(a.llama_bench, path, a.reps)
            out[name]["llama"] = dict(zip(("pp512", "pp2048", "tg@512", "tg@4096"), llama[name]))
    print(f"{info['name']}: device-to-device copy {copy / 1e9:.0f} GB/s (read + write)")
    print(f"{'layout':7} {'load s':>7} {'pp512':>8} {'x':>5} {'pp2048':>8} {'x':>5} {'tg@512':>7} {'x':>5} "
          f"{'GB/s':>6} {'tg@4096':>7} {'x':>5} {'GB/s':>6} {'%copy':>6} {'tg+logits':>9} {'tg+top-k':>8} "
          f"{'chain@512':>9} {'x':>5} {'%copy':>6} {'chain@4096':>10} {'x':>5}")
    for name in a.models.split(","):
        r, l = out[name], llama.get(name, (float("nan"),) * 4)
        r = {k: r.get(k, float("nan")) for k in ("load_s", "pp512", "pp2048", "tg@512", "tg@4096", "gbps@512",
                                                  "gbps@4096", "tg_logits@512", "tg_topk@512", "chain@512", "chain@4096",
                                                  "chain_gbps@512")}
        print(f"{name:7} {r['load_s']:7.2f} {r['pp512']:8.0f} {r['pp512'] / l[0]:5.2f} {r['pp2048']:8.0f} "
              f"{r['pp2048'] / l[1]:5.2f} {r['tg@512']:7.0f} {r['tg@512'] / l[2]:5.2f} {r['gbps@512']:6.0f} "
              f"{r['tg@4096']:7.0f} {r['tg@4096'] / l[3]:5.2f} {r['gbps@4096']:6.0f} "
              f"{100 * r['gbps@512'] / (copy / 1e9):6.1f} {r['tg_logits@512']:9.0f} {r['tg_topk@512']:8.0f} "
              f"{r['chain@512']:9.0f} {r['chain@512'] / l[2]:5.2f} {100 * r['chain_gbps@512'] / (copy / 1e9):6.1f} "
              f"{r['chain@4096']:10.0f} {r['chain@4096'] / l[3]:5.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
