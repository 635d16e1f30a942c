"""The context a session gets when it names none: the model's trained context, bounded by the memory its KV
cache may take, whose pages are taken as positions fill them."""
import os
import subprocess
import sys
import textwrap

import numpy as np

from minfer import _minfer
from tiny_models import llama_f32

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 2  # layers x (K, V) x KV heads x head dim x f16


def run_python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that imports minfer from where this one did (a checkout or an install)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), MINFER_DEVICE="cpu")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env=env)


def test_default_context_is_the_trained_one(tmp_path):
    path = str(tmp_path / "ctx32k.gguf")
    llama_f32(path, context=32768)
    model = _minfer.Model(path)
    assert model.default_context() == 32768
    s = _minfer.Session(model, threads=1)
    assert s.n_ctx == 32768
    logits = s.eval(np.array([1, 5, 9], np.int32), 0)
    assert np.all(np.isfinite(logits))
    # an explicit context still wins, and one beyond the trained context is refused
    assert _minfer.Session(model, n_ctx=100, threads=1).n_ctx == 100


def test_a_long_context_takes_memory_as_positions_fill_it(tmp_path):
    """A 1M-token context's 1 GiB KV cache is reserved, not touched: resident memory grows by what the
    prompt's positions write (the buffers used to be zero-filled vectors, resident at once)."""
    path = str(tmp_path / "ctx1m.gguf")
    llama_f32(path, context=1 << 20)
    r = run_python(f"""
        import numpy as np
        from minfer import _minfer
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        model = _minfer.Model({path!r})
        before = rss()
        s = _minfer.Session(model, threads=1)
        s.eval(np.arange(1, 200, dtype=np.int32), 0)
        print(s.n_ctx, rss() - before)
    """)
    assert r.returncode == 0, r.stderr
    n_ctx, grown = map(int, r.stdout.split())
    assert n_ctx == 1 << 20
    assert grown < (1 << 20) * KV_BYTES_PER_TOKEN // 8, f"resident memory grew by {grown / 2**20:.0f} MiB"


def test_the_default_context_fits_the_memory_left(tmp_path):
    """Under an address-space limit, the default context shrinks to what half the room holds, and says so;
    asking for the whole trained context is refused up front, naming the KV cache."""
    path = str(tmp_path / "ctx4m.gguf")
    llama_f32(path, context=1 << 22)  # 4 GiB of KV in full
    r = run_python(f"""
        import resource
        from minfer import _minfer
        model = _minfer.Model({path!r})
        used = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (used + (1536 << 20), resource.RLIM_INFINITY))
        print(model.default_context(), _minfer.Session(model, threads=1).n_ctx)
        try:
            _minfer.Session(model, n_ctx=1 << 22, threads=1)
        except _minfer.OutOfMemoryError as e:
            print("refused:", e)
    """)
    assert r.returncode == 0, r.stderr
    first, refusal = r.stdout.strip().split("\n")
    chosen, session_ctx = map(int, first.split())
    # half of at most 1.5 GiB left: at most 768 MiB of KV, and at least a third of that after what loading took
    assert 256 << 20 < chosen * KV_BYTES_PER_TOKEN <= 768 << 20 and chosen % 256 == 0
    assert session_ctx <= chosen
    assert "not the model's 4194304" in r.stderr and "RLIMIT_AS" in r.stderr
    assert refusal.startswith("refused: the KV cache (F16, 4194304 tokens x 2 layers)")
