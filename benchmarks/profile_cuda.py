"""Per-kernel GPU time of one decode step.

    MINFER_SHARED=... python benchmarks/profile_cuda.py [--layout 0.5b] [--depth 512]
    python benchmarks/profile_cuda.py --summarize ncu.csv      # a CSV saved earlier
    python benchmarks/profile_cuda.py --layout 7b --detail matvec_q8 --count 8   # ncu's sections per kernel
    python benchmarks/profile_cuda.py --layout 7b --timeline   # the replayed graph's kernels, in time order
    python benchmarks/profile_cuda.py --layout 7b --timeline LIB --batch 16   # a batch step of 16 sequences

Runs a decode loop under Nsight Compute (`ncu`) with CUDA graphs off (so each
kernel is its own launch), warm caches and the GPU's own clocks (`--cache-control
none --clock-control none`: ncu's defaults flush the caches and lock the clocks,
which inflates every small decode kernel), then sums the kernels of the last
decode step by name.  With --detail REGEX, ncu instead reports its sections
(speed of light, warp stalls, occupancy, memory) for the first --count kernels
matching REGEX of one decode step (the profiler is switched on for that step
only, through the driver's cuProfilerStart).  The sum is an upper bound of the replayed step (a graph
overlaps launches); the split says which kernels to work on.

With --timeline, the decode runs as it does for users (graphs replayed, PDL on) and CUPTI's activity
records (`cuda_timeline.cpp`, preloaded) give each kernel's start and end.  A kernel's share of the step
is its end minus the previous kernel's end: what it added to the chain, overlap and gaps included, so the
shares sum to the step.  With --batch B (ncu's sums too), the steps are BatchRunner's: B sequences of `depth`
prompt tokens each in one paged pool, then one greedy token a sequence a step, as bench_batched.py runs them.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = {"0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m", "1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m",
           "7b": "deepseek-r1-distill-qwen-7b-q4_k_m"}


def batch_steps(model, depth: int, steps: int, B: int, before_last=lambda: None) -> None:
    """B sequences of `depth` prompt tokens (a step of up to 512 prompt tokens each), then `steps` batch steps of one
    greedy token a sequence."""
    import numpy as np
    import minfer._minfer as M

    bs = 32
    per_seq = -(-(depth + steps + 1) // bs)
    r = M.BatchRunner(model, n_ctx=depth + steps + 16, threads=1, device="cuda", kv_tokens=B * per_seq * bs,
                      block_size=bs)
    tables = np.zeros((B, r.max_blocks), np.int32)
    tables[:, :per_seq] = np.arange(B * per_seq, dtype=np.int32).reshape(B, per_seq)
    prompt = (np.arange(depth) % 1000).astype(np.int32)
    for s in range(B):
        for c in range(0, depth, 512):
            n = min(512, depth - c)
            r.step_greedy(prompt[c:c + n], np.arange(c, c + n, dtype=np.int32), np.array([n], np.int32),
                          tables[s:s + 1])
    tok, ones = np.full(B, 5, np.int32), np.ones(B, np.int32)
    for i in range(steps):
        if i == steps - 1:
            before_last()
        tok = r.step_greedy(tok, np.full(B, depth + i, np.int32), ones, tables)


def workload(layout: str, depth: int, steps: int, one_step: bool = False, timeline: str = "",
             chain: bool = False, batch: int = 0) -> None:
    """The profiled process: a prompt of `depth` tokens, then `steps` greedy decode steps
    (with one_step, the profiler is on for the last of them only); with `batch`, batch_steps of that many."""
    import ctypes

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import minfer._minfer as M
    from conftest import layout_model

    if batch:
        cuda = ctypes.CDLL("libcuda.so.1") if one_step else None
        batch_steps(M.Model(str(layout_model(LAYOUTS[layout]))), depth, steps, batch,
                    before_last=cuda.cuProfilerStart if cuda else lambda: None)
        if cuda:
            cuda.cuProfilerStop()
        if timeline:
            ctypes.CDLL(timeline).minfer_timeline_flush()
        return
    s = M.Session(M.Model(str(layout_model(LAYOUTS[layout]))), n_ctx=depth + 256, device="cuda")
    s.eval((np.arange(depth) % 1000).astype(np.int32), 0)
    tok = 5
    cuda = ctypes.CDLL("libcuda.so.1") if one_step else None
    if chain:  # the steps as one device chain (Session.decode_greedy), after one step that captures the graph
        tok = s.eval_greedy(np.array([tok], np.int32), depth)
        s.decode_greedy(tok, depth + 1, steps - 1)
        steps = 0
    for i in range(steps):
        if cuda and i == steps - 1:
            cuda.cuProfilerStart()
        tok = s.eval_greedy(np.array([tok], np.int32), depth + i)
    if cuda:
        cuda.cuProfilerStop()
    if timeline:
        ctypes.CDLL(timeline).minfer_timeline_flush()


def short_name(mangled: str) -> str:
    """`_ZN6minfer4cuda45_GLOBAL__N__<hash>_12_matvec_q8_cu_<hash>22matvec_q4k_pipe_kernelILi1EEEvN...` ->
    `matvec_q4k_pipe_kernel<1>`: the last name of the nested name, and its first template argument if that is an
    int (enough to tell the kernels and their per-type builds apart without c++filt)."""
    if not mangled.startswith("_Z"):
        return mangled
    s, i, parts = mangled, 2, []
    if s[i:i + 1] == "N":
        i += 1
    while i < len(s) and s[i].isdigit():
        j = i
        while s[j].isdigit():
            j += 1
        n = int(s[i:j])
        parts.append(s[j:j + n])
        i = j + n
    name = parts[-1] if parts else mangled
    if s[i:i + 1] == "I":  # the first template argument if it is an integer (Li3E)
        j = s.find("E", i)
        arg = s[i + 1:j]
        if arg.startswith("Li"):
            name += "<" + arg[2:] + ">"
    return name


def summarize_timeline(path: str, skip: int = 4, keep: int = 0) -> str:
    """The steps after the first `skip` (only the last `keep` where keep > 0: a batch's prompt steps come first)."""
    rows = list(csv.DictReader(open(path)))
    ks = sorted(({"start": int(r["start"]), "end": int(r["end"]), "grid": int(r["grid"]),
                  "name": short_name(r["name"])} for r in rows), key=lambda k: k["start"])
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("get_rows")]  # a decode step starts with the gather
    steps = [ks[a:b] for a, b in zip(starts, starts[1:])]
    steps = steps[-keep:] if keep else steps[skip:]
    if not steps:
        return "timeline: fewer than two decode steps recorded"
    spans, host_gaps = [], []
    total = collections.defaultdict(lambda: [0.0, 0.0, 0])  # share, duration, count over all steps
    for st in steps:
        st.sort(key=lambda k: k["end"])
        prev = st[0]["start"]
        for k in st:
            t = total[(k["name"], k["grid"])]
            t[0] += (k["end"] - prev) / 1e3
            t[1] += (k["end"] - k["start"]) / 1e3
            t[2] += 1
            prev = max(prev, k["end"])
        spans.append((st[-1]["end"] - st[0]["start"]) / 1e3)
    for a, b in zip(steps, steps[1:]):
        host_gaps.append((min(k["start"] for k in b) - max(k["end"] for k in a)) / 1e3)
    n = len(steps)
    out = [f"{n} decode steps: kernels {sum(len(s) for s in steps) / n:.0f} a step, span {sorted(spans)[n // 2]:.1f} us "
           f"(median), between steps {sorted(host_gaps)[len(host_gaps) // 2] if host_gaps else 0:.1f} us (median)",
           f"  {'kernel':40s} {'grid':>6s} {'count':>5s} {'share us':>9s} {'dur us':>8s} {'share/launch':>12s}"]
    for (name, grid), (share, dur, c) in sorted(total.items(), key=lambda kv: -kv[1][0]):
        out.append(f"  {name[:40]:40s} {grid:6d} {c / n:5.0f} {share / n:9.1f} {dur / n:8.1f} {share / c:12.2f}")
    one = steps[-1]
    one.sort(key=lambda k: k["start"])
    mid = len(one) // 2
    out.append("one layer in time order (start, end relative to the previous kernel's end, us):")
    prev = one[mid - 1]["end"]
    for k in one[mid:mid + 14]:
        out.append(f"  {k['name'][:40]:40s} {k['grid']:6d} start {(k['start'] - prev) / 1e3:+7.2f} "
                   f"dur {(k['end'] - k['start']) / 1e3:7.2f} share {(k['end'] - prev) / 1e3:6.2f}")
        prev = k["end"]
    return "\n".join(out)


def summarize(path: str) -> str:
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    names, values = rows[head].index("Kernel Name"), rows[head].index("Metric Value")
    data = rows[head + 1:]
    last = max(i for i, r in enumerate(data) if "get_rows" in r[names])  # a decode step starts with the gather
    total = collections.defaultdict(lambda: [0.0, 0])
    for r in data[last:]:
        name = r[names].split("(")[0].replace("(anonymous namespace)::", "").replace("unnamed>::", "")
        total[name][0] += float(r[values].replace(",", "")) / 1e3
        total[name][1] += 1
    s = sum(t for t, _ in total.values())
    out = [f"one decode step: {sum(c for _, c in total.values())} kernels, {s:.1f} us summed"]
    for name, (t, c) in sorted(total.items(), key=lambda kv: -kv[1][0]):
        out.append(f"  {name:32s} {t:8.1f} us  {c:4d} x {t / c:6.2f} us  {100 * t / s:5.1f} %")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="0.5b", choices=sorted(LAYOUTS))
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--summarize", default="", help="summarize a saved ncu CSV instead of profiling")
    ap.add_argument("--detail", default="", help="ncu sections for the kernels matching this regex")
    ap.add_argument("--count", type=int, default=4, help="with --detail: how many matching kernels")
    ap.add_argument("--timeline", default="", metavar="LIB",
                    help="the kernel timeline of replayed decode steps, through this build of cuda_timeline.cpp")
    ap.add_argument("--steps", type=int, default=24, help="with --timeline: decode steps to record")
    ap.add_argument("--chain", action="store_true", help="with --timeline: the steps as one decode_greedy chain")
    ap.add_argument("--batch", type=int, default=0, help="profile BatchRunner's steps of this many sequences")
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--one-step", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.workload:
        return workload(a.layout, a.depth, a.steps if a.timeline else 2, a.one_step, a.timeline, a.chain, a.batch)
    if a.timeline:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "timeline.csv"
            lib = str(Path(a.timeline).resolve())
            env = dict(os.environ, CUDA_TIMELINE_CSV=str(out), LD_PRELOAD=lib)
            subprocess.run([sys.executable, __file__, "--workload", "--layout", a.layout, "--depth", str(a.depth),
                            "--steps", str(a.steps), "--timeline", lib, "--batch", str(a.batch)] + ["--chain"] * a.chain,
                           env=env, check=True)
            return print(summarize_timeline(str(out), keep=a.steps - 4 if a.batch else 0))
    if a.summarize:
        return print(summarize(a.summarize))
    if a.detail:
        cmd = ["ncu", "--cache-control", "none", "--clock-control", "none", "--profile-from-start", "off",
               "--kernel-name", f"regex:{a.detail}", "--launch-count", str(a.count)]
        for section in ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "MemoryWorkloadAnalysis"):
            cmd += ["--section", section]
        cmd += [sys.executable, __file__, "--workload", "--one-step", "--layout", a.layout, "--depth", str(a.depth),
                "--batch", str(a.batch)]
        subprocess.run(cmd, env=dict(os.environ, MINFER_CUDA_GRAPHS="0"), check=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ncu.csv"
        cmd = ["ncu", "--cache-control", "none", "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
               "--csv", sys.executable, __file__, "--workload", "--layout", a.layout, "--depth", str(a.depth),
               "--batch", str(a.batch)]
        with open(out, "w") as f:
            subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, MINFER_CUDA_GRAPHS="0"),
                           check=True)
        print(summarize(str(out)))


if __name__ == "__main__":
    main()
