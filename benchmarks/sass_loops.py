"""Instruction counts of a CUDA file's kernels and of their loops, without a GPU.

Compiles one .cu file to a cubin (nvcc -cubin -Xptxas -v), disassembles it with cuobjdump, and prints per
kernel its registers and spills (ptxas) and, for every backward branch, the instructions of the loop it
closes, by opcode: a kernel's cost in instructions, counted on a machine without a GPU before spending GPU
time.  cuobjdump is not in the toolkit's nvcc-only install; it comes
from PyPI: `pip download --no-deps nvidia-cuda-cuobjdump` and unzip the wheel (bin/cuobjdump).

    python benchmarks/sass_loops.py csrc/backends/cuda/matvec_q8.cu --kernel block_kernelILi14 --min 60
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def compile_cubin(src: Path, cubin: Path, arch: str) -> str:
    cmd = ["nvcc", "-O3", f"-arch={arch}", "-std=c++17", "--expt-relaxed-constexpr", "-Icsrc", "-cubin",
           "-o", str(cubin), str(src), "-Xptxas", "-v"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    return r.stderr


def ptxas_usage(log: str) -> dict:
    """mangled kernel name -> (registers, spill store bytes, spill load bytes)"""
    out, name, spill = {}, None, (0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            name, spill = m.group(1), (0, 0)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out[name] = (int(m.group(1)),) + spill
    return out


def loops(sass: str, match: str, min_len: int):
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = block.split("\n")[0].strip()
        if match not in name:
            continue
        ins = [(int(a, 16), s.strip()) for a, s in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", block)]
        found = []
        for addr, s in ins:
            t = re.search(r"BRA\s+(?:\S+,\s*)?0x([0-9a-f]+)", s)
            if t and int(t.group(1), 16) < addr:
                body = [x for a, x in ins if int(t.group(1), 16) <= a <= addr]
                if len(body) >= min_len:
                    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in body)
                    found.append((int(t.group(1), 16), addr, len(body), ops))
        yield name, len(ins), found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("--kernel", default="", help="a substring of the mangled kernel names to show")
    ap.add_argument("--min", type=int, default=40, help="loops shorter than this many instructions are not shown")
    ap.add_argument("--arch", default="sm_90")
    a = ap.parse_args()
    if not shutil.which("cuobjdump"):
        sys.exit("cuobjdump is not on PATH (see this script's docstring for where to get it)")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        usage = ptxas_usage(compile_cubin(a.src, cubin, a.arch))
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    for name, n, found in loops(sass, a.kernel, a.min):
        regs, st, ld = usage.get(name, (0, 0, 0))
        print(f"{name}: {n} instructions, {regs} registers, spills {st} / {ld} bytes (stores / loads)")
        for lo, hi, length, ops in found:
            top = ", ".join(f"{k} {v}" for k, v in ops.most_common(10))
            print(f"  loop {lo:#x}..{hi:#x}: {length} instructions ({top})")


if __name__ == "__main__":
    main()
