"""How the weights reach memory: the file mapped at a 2 MB boundary (so that a page cache holding it in
2 MB folios maps as huge pages), and a freshly downloaded model written out and dropped from the page
cache (so that its first load reads it back in 2 MB folios).  Linux only: elsewhere they skip."""
import ctypes
import os
import sys

import numpy as np
import pytest

import minfer
from conftest import synthetic_model
from gguf_writer import build_gguf, f32_tensor

M = minfer._minfer
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux page-cache and /proc behaviour")


def _mapping_of(path):
    with open("/proc/self/maps") as f:
        lines = [ln.split() for ln in f if ln.rstrip().endswith(str(path))]
    return [(int(ln[0].split("-")[0], 16), int(ln[0].split("-")[1], 16), ln[1]) for ln in lines]


def _check_aligned(path):
    maps = _mapping_of(path)
    assert len(maps) == 1, maps  # one mapping of the whole file, the reservation's slack given back
    start, end, perms = maps[0]
    assert start % (2 << 20) == 0, hex(start)
    assert end - start == (os.path.getsize(path) + 4095) // 4096 * 4096
    assert perms == "r--s"


@linux
def test_weights_mapped_read_only_at_a_2mb_boundary(tmp_path):
    # a file under 2 MB (which the kernel itself would place anywhere) and a model
    small = tmp_path / "small.gguf"
    small.write_bytes(build_gguf([], [f32_tensor("w", np.arange(64).reshape(8, 8))]).data)
    f = M.GGUFFile(str(small))
    _check_aligned(os.path.realpath(small))
    del f
    path = os.path.realpath(synthetic_model("qwen2-tiny-q4_0"))
    model = M.Model(path)
    _check_aligned(path)
    ids = np.array([5, 900, 77], np.int32)
    assert np.isfinite(np.asarray(M.Session(model, threads=1, n_ctx=16).eval(ids, 0))).all()


def _resident_fraction(path):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: nothing is touched
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        pages = (size + 4095) // 4096
        vec = ctypes.create_string_buffer(pages)
        assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) / pages


def _fs_type(path):
    best, kind = "", ""
    with open("/proc/mounts") as f:
        for ln in f:
            mnt, fs = ln.split()[1], ln.split()[2]
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fs
    return kind


@linux
def test_release_page_cache_drops_a_written_file(tmp_path):
    from minfer import hub

    if _fs_type(tmp_path) in ("tmpfs", "ramfs", "overlay"):
        pytest.skip(f"{tmp_path} is on {_fs_type(tmp_path)}: its pages have no disk to be dropped to")
    f = tmp_path / "w.bin"
    data = np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8).tobytes()
    f.write_bytes(data)
    assert _resident_fraction(f) > 0.9  # just written: cached
    assert hub.release_page_cache(f)
    assert _resident_fraction(f) < 0.1
    assert f.read_bytes() == data  # and read back from the disk intact
