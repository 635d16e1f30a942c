"""Bad input and resource use: model errors by kind, shape mismatches,
unsupported tensor types, repeated open/generate/close without leaks."""
import os

import numpy as np
import pytest

import minfer
from conftest import synthetic_model

M = minfer._minfer
SEEDS = os.path.join(os.path.dirname(__file__), "fuzz", "make_seeds.py")


def tiny_model(tmp_path, mutate=None):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_seeds", SEEDS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    p = tmp_path / "tiny.gguf"
    p.write_bytes(mod.tiny_llama() if mutate is None else mutate(mod))
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
