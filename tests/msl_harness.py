"""Running metal/*.metal on the CPU through the MSL emulator (tests/mslemu/).

    k = msl_harness.kernels()                      # built once per session (g++, ~10 s)
    k.dispatch("rms_norm", {0: args, 1: x, 2: w, 3: y}, grid=(rows, 1, 1), tg=(256, 1, 1),
               tg_bytes={0: 32 * 4}, seed=0)

Buffers are numpy arrays (or bytes for argument structs), bound by index as a
Metal encoder binds them; outputs are written in place.  `seed` picks the
order in which the fibers of a threadgroup run.  MSL_SANITIZE=1 builds with
AddressSanitizer + UBSan (the caller's process must preload libasan).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
EMU = REPO / "tests" / "mslemu"
MAX_BUFFERS = 16


class Uint3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint32), ("y", ctypes.c_uint32), ("z", ctypes.c_uint32)]


class Dispatch(ctypes.Structure):
    _fields_ = [("buffers", ctypes.c_void_p * MAX_BUFFERS), ("buffer_bytes", ctypes.c_size_t * MAX_BUFFERS),
                ("tg_bytes", ctypes.c_size_t * MAX_BUFFERS), ("grid", Uint3), ("tg", Uint3),
                ("seed", ctypes.c_uint64)]


class MslError(RuntimeError):
    pass


class Kernels:
    def __init__(self, lib_path: Path):
        self.lib = ctypes.CDLL(str(lib_path))
        self.lib.msl_kernel_names.restype = ctypes.c_char_p
        self.names = self.lib.msl_kernel_names().decode().split(",")

    def dispatch(self, name: str, buffers: dict, grid, tg, tg_bytes: dict | None = None, seed: int = 0) -> None:
        if name not in self.names:
            raise KeyError(f"no kernel {name!r} in metal/ (have {', '.join(self.names)})")
        d = Dispatch()
        keep = []
        for i, b in buffers.items():
            if isinstance(b, (bytes, bytearray)):
                b = np.frombuffer(bytearray(b), np.uint8)
            if not (b.flags.c_contiguous and b.flags.writeable):
                raise ValueError(f"buffer {i} must be a writable C-contiguous array")
            keep.append(b)
            d.buffers[i] = b.ctypes.data
            d.buffer_bytes[i] = b.nbytes
        for i, n in (tg_bytes or {}).items():
            d.tg_bytes[i] = n
        d.grid = Uint3(*grid)
        d.tg = Uint3(*tg)
        d.seed = seed
        fn = getattr(self.lib, f"msl_launch_{name}")
        fn.restype = ctypes.c_char_p
        err = fn(ctypes.byref(d)).decode()
        if err:
            raise MslError(err)


_cache: dict = {}


def build(sources: list[Path], sanitize: bool = False) -> Kernels:
    """The emulator library for these .metal files (cached under build/mslemu by content)."""
    key = (tuple(str(p) for p in sources), sanitize)
    if key in _cache:
        return _cache[key]
    deps = list(sources) + sorted((REPO / "metal").glob("*.h")) + sorted(EMU.iterdir())
    h = hashlib.sha256(str(sanitize).encode())
    for p in deps:
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    out = REPO / "build" / "mslemu" / h.hexdigest()[:16]
    lib = out / "kernels.so"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        cpp = out / "kernels.cpp"
        r = subprocess.run([sys.executable, str(EMU / "mslpp.py"), str(cpp)] + [str(s) for s in sources],
                           capture_output=True, text=True)
        if r.returncode:
            raise MslError(r.stderr.strip() or r.stdout.strip())
        flags = ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-strict-aliasing"]
        if sanitize:
            flags += ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        cmd = ["g++", "-std=c++20", "-shared", "-fPIC", "-Wall", "-Wno-attributes", "-Wno-unused-function",
               "-Wno-unknown-pragmas", *flags, "-I", str(EMU), "-I", str(REPO / "metal"), str(cpp),
               str(EMU / "msl_runtime.cpp"), "-o", str(lib) + ".tmp"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise MslError("building the emulated kernels failed:\n" + r.stderr[-6000:])
        os.replace(str(lib) + ".tmp", lib)
    _cache[key] = Kernels(lib)
    return _cache[key]


def kernels(sanitize: bool | None = None) -> Kernels:
    """Every kernel of metal/*.metal, emulated (MSL_SANITIZE=1: the ASan + UBSan build)."""
    sanitize = os.environ.get("MSL_SANITIZE") == "1" if sanitize is None else sanitize
    return build(sorted((REPO / "metal").glob("*.metal")), sanitize)


@pytest.fixture(scope="module")
def k():
    """The emulated kernels, for a test module that imports this fixture."""
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed (the emulator compiles metal/*.metal with it)")
    return kernels()


def pack(fmt, *vals):
    """A kernel's argument struct: little-endian fields packed by struct's format."""
    return bytearray(struct.pack("<" + fmt, *vals))
