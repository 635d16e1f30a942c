"""A Q8_0 model with the shapes and metadata of a real one, from its header.

    python benchmarks/layout_q8_0.py HEADER.gguf OUT.gguf [--seed 0]

The headers in ../shared/fixtures/layouts hold every tensor's name, shape and
type of a real Q4_K_M file (no weights).  This writes the same model with every
quantized matrix as Q8_0 (norms and biases stay f32), offsets recomputed, and
random weights of realistic size (|w| ~ 0.02; norms ~ 1), so the "Q8_0 layout"
benchmarks of issue 6 have a file.  The metadata section is copied byte for
byte; only the tensor table and the data are new.
"""
from __future__ import annotations

import struct
import sys

import numpy as np

# GGUF metadata value types -> struct format (8 = string, 9 = array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
F32, F16, Q8_0 = 0, 1, 8
QUANT_BLOCK = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84), 11: (256, 110),
               12: (256, 144), 13: (256, 176), 14: (256, 210)}


class Reader:
    def __init__(self, data: bytes):
        self.b, self.at = data, 0

    def take(self, fmt: str):
        v = struct.unpack_from("<" + fmt, self.b, self.at)[0]
        self.at += struct.calcsize("<" + fmt)
        return v

    def string(self) -> bytes:
        n = self.take("Q")
        s = self.b[self.at:self.at + n]
        self.at += n
        return s

    def skip_value(self, t: int) -> None:
        if t in SCALARS:
            self.at += struct.calcsize("<" + SCALARS[t])
        elif t == 8:
            self.string()
        elif t == 9:
            et, n = self.take("I"), self.take("Q")
            for _ in range(n):
                self.skip_value(et)
        else:
            raise ValueError(f"unknown GGUF value type {t}")


def read_header(path: str):
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.at = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    kv_start, alignment = r.at, 32
    for _ in range(n_kv):
        key, t = r.string(), r.take("I")
        if key == b"general.alignment" and t == 4:
            alignment = r.take("I")
        else:
            r.skip_value(t)
    kv_bytes = data[kv_start:r.at]
    tensors = []
    for _ in range(n_tensors):
        name, nd = r.string(), r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        ttype = r.take("I")
        r.take("Q")  # the old offset: recomputed below
        tensors.append((name, dims, ttype))
    return version, n_kv, kv_bytes, alignment, tensors


def main(argv: list[str]) -> None:
    src, dst = argv[0], argv[1]
    seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
    rng = np.random.default_rng(seed)
    version, n_kv, kv_bytes, align, tensors = read_header(src)
    plan, offset = [], 0
    for name, dims, ttype in tensors:
        n = int(np.prod(dims))
        new = Q8_0 if ttype in QUANT_BLOCK or (ttype == F16 and len(dims) > 1) else ttype
        if new == Q8_0 and dims[0] % 32:
            raise ValueError(f"{name.decode()}: {dims[0]} columns do not make Q8_0 blocks")
        nbytes = n // 32 * 34 if new == Q8_0 else n * (4 if new == F32 else 2)
        plan.append((name, dims, new, offset, nbytes))
        offset += (nbytes + align - 1) // align * align
    with open(dst, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", version, len(tensors), n_kv) + kv_bytes)
        for name, dims, ttype, off, _ in plan:
            f.write(struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims)))
            f.write(struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype, off))
        f.write(b"\0" * (-f.tell() % align))
        base = f.tell()
        for name, dims, ttype, off, nbytes in plan:
            f.write(b"\0" * (base + off - f.tell()))
            n = int(np.prod(dims))
            if ttype == Q8_0:
                for start in range(0, n // 32, 1 << 22):  # 4M blocks (136 MB) at a time
                    nb = min(1 << 22, n // 32 - start)
                    blk = rng.integers(-127, 128, size=(nb, 34), dtype=np.int16).astype(np.int8).view(np.uint8)
                    d = (rng.uniform(0.5, 1.5, nb) * 3e-4).astype(np.float16).view(np.uint8).reshape(nb, 2)
                    blk[:, :2] = d
                    f.write(blk.tobytes())
            else:
                v = rng.standard_normal(n).astype(np.float32) * 0.02 + (1.0 if b"norm" in name else 0.0)
                f.write(v.astype(np.float32 if ttype == F32 else np.float16).tobytes())
    print(f"{dst}: {len(tensors)} tensors, {base + offset} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
