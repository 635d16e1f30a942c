"""The machine's streaming-read bandwidth: the ceiling for decode.

    python benchmarks/bench_bandwidth.py [--threads 1,2] [--mib 512]

Reads a buffer much larger than the caches with 1..N threads (minfer's own
pool) and prints the best GB/s of several passes; bench_e2e.py reports decode
bandwidth against it."""
import argparse

from minfer import quants


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    import minfer._minfer as M

    for t in (int(x) for x in a.threads.split(",")):
        gbps = M.read_bandwidth_gbps(a.mib << 20, a.reps, quants.ThreadPool(t))
        print(f"threads={t}: {gbps:.1f} GB/s streaming read ({a.mib} MiB, best of {a.reps})")


if __name__ == "__main__":
    main()
