"""Turn a pytest-benchmark JSON of bench_matmul.py into the Markdown tables of RESULTS.md."""
import json
import sys
from collections import defaultdict


def main(path):
    data = json.load(open(path))
    mv, mm = defaultdict(dict), defaultdict(dict)
    for b in data["benchmarks"]:
        e = b["extra_info"]
        key = (e["type"], f'{e["rows"]}x{e["cols"]}')
        if e["kind"] == "matvec":
            mv[key][e["isa"]] = e["gbps"]
        else:
            mm[key][e["isa"]] = e["gflops"]
    isas = ["scalar", "avx2", "avx512"]
    print(f'machine: {data["machine_info"].get("cpu", {}).get("brand_raw", "?")}, {data["datetime"]}')
    print("\nmatrix-vector, GB/s of weights streamed (median)\n")
    print("| type | shape | " + " | ".join(isas) + " |\n|---|---|" + "---|" * len(isas))
    for (t, s), r in mv.items():
        print(f"| {t} | {s} | " + " | ".join(f"{r[i]:.1f}" if i in r else "-" for i in isas) + " |")
    print("\nmatrix-matrix, 512 tokens, GFLOP/s (median)\n")
    print("| type | shape | " + " | ".join(isas[1:]) + " |\n|---|---|" + "---|" * 2)
    for (t, s), r in mm.items():
        print(f"| {t} | {s} | " + " | ".join(f"{r[i]:.0f}" if i in r else "-" for i in isas[1:]) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
