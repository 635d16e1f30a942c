"""Per-kernel GPU time of one decode step (how run 19 of CUDA_NOTES.md was measured).

    MINFER_SHARED=... python benchmarks/profile_cuda.py [--layout 0.5b] [--depth 512]
    python benchmarks/profile_cuda.py --summarize ncu.csv      # a CSV saved earlier
    python benchmarks/profile_cuda.py --layout 7b --detail matvec_q8 --count 8   # ncu's sections per kernel

Runs a decode loop under Nsight Compute (`ncu`) with CUDA graphs off (so each
kernel is its own launch), warm caches and the GPU's own clocks (`--cache-control
none --clock-control none`: ncu's defaults flush the caches and lock the clocks,
which inflates every small decode kernel), then sums the kernels of the last
decode step by name.  With --detail REGEX, ncu instead reports its sections
(speed of light, warp stalls, occupancy, memory) for the first --count kernels
matching REGEX of one decode step (the profiler is switched on for that step
only, through the driver's cuProfilerStart).  The sum is an upper bound of the replayed step (a graph
overlaps launches); the split says which kernels to work on.
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


def workload(layout: str, depth: int, steps: int, one_step: bool = False) -> None:
    """The profiled process: a prompt of `depth` tokens, then `steps` greedy decode steps
    (with one_step, the profiler is on for the last of them only)."""
    import ctypes

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import minfer._minfer as M
    from conftest import layout_model

    s = M.Session(M.Model(str(layout_model(LAYOUTS[layout]))), n_ctx=depth + 256, device="cuda")
    s.eval((np.arange(depth) % 1000).astype(np.int32), 0)
    tok = 5
    cuda = ctypes.CDLL("libcuda.so.1") if one_step else None
    for i in range(steps):
        if cuda and i == steps - 1:
            cuda.cuProfilerStart()
        tok = s.eval_greedy(np.array([tok], np.int32), depth + i)
    if cuda:
        cuda.cuProfilerStop()


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
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--one-step", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.workload:
        return workload(a.layout, a.depth, 2, a.one_step)
    if a.summarize:
        return print(summarize(a.summarize))
    if a.detail:
        cmd = ["ncu", "--cache-control", "none", "--clock-control", "none", "--profile-from-start", "off",
               "--kernel-name", f"regex:{a.detail}", "--launch-count", str(a.count)]
        for section in ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "MemoryWorkloadAnalysis"):
            cmd += ["--section", section]
        cmd += [sys.executable, __file__, "--workload", "--one-step", "--layout", a.layout, "--depth", str(a.depth)]
        subprocess.run(cmd, env=dict(os.environ, MINFER_CUDA_GRAPHS="0"), check=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ncu.csv"
        cmd = ["ncu", "--cache-control", "none", "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
               "--csv", sys.executable, __file__, "--workload", "--layout", a.layout, "--depth", str(a.depth)]
        with open(out, "w") as f:
            subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, MINFER_CUDA_GRAPHS="0"),
                           check=True)
        print(summarize(str(out)))


if __name__ == "__main__":
    main()
