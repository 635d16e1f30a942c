"""Bad input and resource use: model errors by kind, shape mismatches,
unsupported tensor types, repeated open/generate/close without leaks."""
import os

import numpy as np
import pytest

import minfer
from conftest import synthetic_model

M = minfer._minfer
SEEDS = os.path.join(os.path.dirname(__file__), "fuzz", "make_seeds.py")


def tiny_model(tmp_path, mutate=None, **shape):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_seeds", SEEDS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    p = tmp_path / "tiny.gguf"
    p.write_bytes(mod.tiny_llama(**shape) if mutate is None else mutate(mod))
    return p


def test_tiny_model_runs(tmp_path):
    s = M.Session(M.Model(str(tiny_model(tmp_path))), n_ctx=16, threads=1)
    assert np.isfinite(s.eval(np.array([1, 2, 3], np.int32), 0, all_logits=True)).all()


def test_shape_mismatch_and_bad_metadata(tmp_path):
    from gguf_writer import F32, STR, U32, build_gguf, f32_tensor

    def wrong_ffn(mod):  # ffn_down of the wrong width
        data = mod.tiny_llama()
        return data.replace(b"llama.feed_forward_length", b"llama.feed_forward_lengtX")
    with pytest.raises(minfer.ModelError, match="lacks the metadata key 'llama.feed_forward_length'"):
        M.Model(str(tiny_model(tmp_path, wrong_ffn)))
    kv = [("general.architecture", STR, "llama"), ("llama.block_count", U32, 1), ("llama.embedding_length", U32, 8),
          ("llama.feed_forward_length", U32, 16), ("llama.attention.head_count", U32, 3),
          ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5)]
    p = tmp_path / "bad.gguf"
    p.write_bytes(build_gguf(kv, [f32_tensor("token_embd.weight", np.ones((12, 8)))]).data)
    with pytest.raises(minfer.ModelError):
        M.Model(str(p))
    kv[4] = ("llama.attention.head_count", U32, 2)
    p.write_bytes(build_gguf(kv, [f32_tensor("token_embd.weight", np.ones((12, 9))),
                                  f32_tensor("output_norm.weight", np.ones(8))]).data)
    with pytest.raises(minfer.ModelError, match=r"'token_embd.weight' has shape \[9, 12\], expected \[8, 12\]"):
        M.Model(str(p))


def test_unsupported_tensor_type(tmp_path):
    def iq_type(mod):
        import struct
        built = mod.build_gguf  # noqa: F841 - rebuild with a type minfer cannot multiply
        data = bytearray(mod.tiny_llama())
        # find blk.0.ffn_up.weight's type field: the u32 after its dims; patch F32 (0) -> I32 (26)
        name = b"blk.0.ffn_up.weight"
        at = data.find(name) + len(name)
        n_dims = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, 26)
        return bytes(data)
    with pytest.raises(minfer.ModelError, match="'blk.0.ffn_up.weight' has type I32, which minfer cannot multiply"):
        M.Model(str(tiny_model(tmp_path, iq_type)))


UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
no_asan = pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer's quarantine holds freed memory: RSS says nothing")


def _rss_kb():
    # anonymous memory only: the mmap'd weights' file pages count in VmRSS as they are touched
    # (a sampled token touches its embedding row), which is page cache, not a leak
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))


def _maps():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


@no_asan
def test_open_generate_close_200_times_does_not_leak(tmp_path):
    # the tiny llama (12-token vocabulary) keeps each cycle fast; a leaked mapping, descriptor,
    # session or thread pool would still show in the counts below
    path = str(tiny_model(tmp_path))
    def cycle():
        with minfer.LLM(path, n_ctx=64, threads=2) as llm:
            llm.generate([1, 2, 3], max_tokens=2)
    for _ in range(5):  # warm-up: allocator pools, caches, lazy imports
        cycle()
    rss0, maps0, fds0 = _rss_kb(), _maps(), len(os.listdir("/proc/self/fd"))
    for _ in range(200):
        cycle()
    # slack: 48 MB of allocator noise (a leaked model mapping would be ~48 MB each time, 9.6 GB in all)
    assert _rss_kb() - rss0 < 48 * 1024, (rss0, _rss_kb())
    assert _maps() - maps0 < 20, (maps0, _maps())
    assert len(os.listdir("/proc/self/fd")) <= fds0


@no_asan
def test_1000_generations_on_one_model(tmp_path):
    llm = minfer.LLM(str(tiny_model(tmp_path)), n_ctx=64, threads=2)
    for i in range(50):
        llm.generate([4, 5, i % 12], max_tokens=3, temperature=0.8, seed=i)
    rss0 = _rss_kb()
    for i in range(1000):
        llm.generate([4, 5, i % 12], max_tokens=3, temperature=0.8, seed=i)
    assert _rss_kb() - rss0 < 8 * 1024, (rss0, _rss_kb())


def test_keyboard_interrupt_mid_generation_leaves_the_model_usable():
    import _thread
    import signal
    import threading

    path = str(synthetic_model("qwen2-tiny-q8_0"))
    llm = minfer.LLM(path, n_ctx=512, threads=2)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    got = 0
    # a process started in the background may inherit SIGINT ignored; Python then never raises
    # KeyboardInterrupt for it, so the test installs the ordinary handler itself
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in llm.stream(list(range(100, 110)), max_tokens=480, temperature=1.0, seed=3):
                got += 1
                if got == 1:
                    timer.start()  # Ctrl-C arrives while tokens are being generated
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    assert 0 < got < 480
    # usable, and its KV bookkeeping is still right: the same answer as a fresh model
    a = llm.generate(list(range(100, 108)), max_tokens=8)
    b = minfer.LLM(path, n_ctx=512, threads=2).generate(list(range(100, 108)), max_tokens=8)
    assert a.tokens == b.tokens


def test_consumer_abandoning_a_stream_releases_the_model():
    path = str(synthetic_model("qwen2-tiny-q8_0"))
    llm = minfer.LLM(path, n_ctx=128, threads=1)
    it = llm.stream([5, 6, 7], max_tokens=50)
    next(it)
    del it  # the generator closes; its lock is released
    assert llm.generate([5, 6, 7], max_tokens=2).metrics.generated_tokens >= 0


# --- memory: a KV cache that cannot fit is refused up front -------------------------------------

def wide_model(tmp_path):
    # one KV head of width 1024: 8 KiB of f32 K+V per token, and a context length of 2^24
    return tiny_model(tmp_path, E=1024, H=1, ctx=1 << 24)


def test_kv_cache_larger_than_ram_fails_cleanly(tmp_path):
    path = str(wide_model(tmp_path))
    n_ctx = 1 << 24  # 128 GiB of f32 KV cache: more than the machines running this suite have
    with pytest.raises(minfer.OutOfMemoryError, match=r"the KV cache \(F32, 16777216 tokens x 1 layers\) needs 131072\.0 MiB "
                                                      r"but only [0-9.]+ MiB of memory is available \(.*\); ask for a smaller n_ctx"):
        M.Session(M.Model(path), n_ctx=n_ctx, threads=1, kv_type="f32")
    # the same through the Python API, and it is a MemoryError too
    with pytest.raises(MemoryError):
        minfer.LLM(path, n_ctx=n_ctx, threads=1, kv_type="f32")
    # a context that fits still works on the same file
    with minfer.LLM(path, n_ctx=256, threads=1) as llm:
        assert len(llm.generate([1, 2], max_tokens=2).tokens) == 2


@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot apply")
def test_kv_cache_respects_the_address_space_limit(tmp_path):
    # RLIMIT_AS (ulimit -v) below what the KV cache needs: the error names that limit,
    # in a child process so the limit does not touch the test runner
    import subprocess, sys, textwrap
    path = str(wide_model(tmp_path))
    code = textwrap.dedent(f"""
        import resource, minfer
        vm = int([l for l in open('/proc/self/status') if l.startswith('VmSize')][0].split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        m = minfer._minfer.Model({path!r})
        try:
            minfer._minfer.Session(m, n_ctx=1 << 20, threads=1)   # 8 GiB > 1 GiB of headroom
        except minfer.OutOfMemoryError as e:
            print("REFUSED", e)
        s = minfer._minfer.Session(m, n_ctx=1 << 14, threads=1)   # 128 MiB fits
        print("OK", s.n_ctx)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "REFUSED" in r.stdout and "(RLIMIT_AS)" in r.stdout, r.stdout
    assert "OK 16384" in r.stdout


# --- files: a GGUF changed under a running model is an error at the next step, not SIGBUS ------------

def test_truncated_file_under_a_running_model_raises(tmp_path):
    path = tiny_model(tmp_path)
    llm = minfer.LLM(str(path), n_ctx=64, threads=1)
    llm.generate([1, 2, 3], max_tokens=2)
    size = path.stat().st_size
    os.truncate(path, size // 2)  # another process cutting the file (a re-download, a full disk)
    with pytest.raises(minfer.GGUFError, match=rf"changed size while in use \({size} bytes at open, now {size // 2}\)"):
        llm.generate([1, 2, 3], max_tokens=2)
    with pytest.raises(minfer.GGUFError):  # and stays refused: nothing reads the lost pages
        llm.generate([4], max_tokens=1)
    llm.close()


def test_rewritten_file_under_a_running_model_raises(tmp_path):
    path = tiny_model(tmp_path)
    llm = minfer.LLM(str(path), n_ctx=64, threads=1)
    llm.generate([1, 2, 3], max_tokens=2)
    data = bytearray(path.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # same size, one weight now +inf
    with open(path, "r+b") as f:  # in place: the mapping sees the new bytes
        f.write(data)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse-clock filesystems: make the change visible
    with pytest.raises(minfer.GGUFError, match="was modified while in use"):
        llm.generate([1, 2, 3], max_tokens=2)
    llm.close()


def test_model_file_is_opened_read_only(tmp_path):
    path = tiny_model(tmp_path)
    before = path.read_bytes(), path.stat().st_mtime_ns
    with minfer.LLM(str(path), n_ctx=64, threads=1) as llm:
        flags = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                    flags.append(int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8))
            except OSError:
                pass
        assert flags, "the model file should be held open (for the change check)"
        assert all(f & os.O_ACCMODE == os.O_RDONLY for f in flags)
        llm.generate([1, 2, 3], max_tokens=4)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
