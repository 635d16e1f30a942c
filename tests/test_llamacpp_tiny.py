"""Rung 3 on two small models with llama.cpp's logits (tests/fixtures/tiny/README.md), on the CPU and CUDA:

* IQ4_NL, IQ4_XS and BF16 weights, quantized by llama.cpp's own quantizer.  The blocks are also checked
  against the `gguf` package's dequantization, which is independent of ours and of llama.cpp's C code.
  Bound: the synthetic fixtures' ~3e-2 on max |dlogit| for quantized weights.  Both engines quantize
  activations to 8 bits, in different orders.  Logits here have a spread of 0.8; we measured 6e-3.
* gemma3: sliding-window and global layers, linear RoPE scaling, sandwich norms, GELU gate, softcap.
  Bound: twice the spread between llama.cpp and an exact float64 forward on the same weights (README: max
  0.081, mean 0.013).  An off-by-one window (mean 0.11), unscaled RoPE (mean 0.05-0.07) or a missing
  softcap (max 1.4) falls outside it."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minfer
from conftest import require_cuda
from minfer.quants import GGMLType as T, dequantize

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "tiny"
IQ4 = FIXTURE / "iq4-mix.gguf"
GEMMA_SHA256 = "c5dbb8bbc7a6699f477dd0d9a4e759425d87f460221ae748dd8440dcaed4dadc"
BOUNDS = {  # model: (max, mean, prompt top-1 agreement, decode top-1 agreement)
    "iq4-mix": (3e-2, 5e-3, 0.95, 0.9),
    "gemma3-q8_0": (0.15, 0.025, 0.9, 0.8),
}


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "gemma3-q8_0.gguf"
    subprocess.run([sys.executable, str(HERE / "tiny_models.py"), "gemma3-q8_0", str(out)], check=True)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == GEMMA_SHA256, "tiny_models.py no longer writes the fixture's model"
    return out


def test_iq4_fixture_holds_the_three_types():
    f = minfer.gguf.open(str(IQ4))
    assert {T.IQ4_NL, T.IQ4_XS, T.BF16} <= {info.type for info in f.tensors.values()}


def test_llamacpp_blocks_match_the_gguf_package():
    gguf = pytest.importorskip("gguf", reason="the PyPI `gguf` package is the independent oracle")
    from gguf import quants as gq

    f = minfer.gguf.open(str(IQ4))
    checked = set()
    for name, info in f.tensors.items():
        if info.type not in (T.IQ4_NL, T.IQ4_XS, T.BF16):
            continue
        raw = np.ascontiguousarray(np.asarray(info.data).view(np.uint8))
        want = np.asarray(gq.dequantize(raw, gguf.GGMLQuantizationType(int(info.type))), np.float32).reshape(-1)
        assert np.array_equal(dequantize(raw.reshape(-1), info.type).view(np.uint32), want.view(np.uint32)), name
        checked.add(info.type)
    assert checked == {T.IQ4_NL, T.IQ4_XS, T.BF16}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", ["p48", "p200"])
@pytest.mark.parametrize("model", sorted(BOUNDS))
def test_against_llamacpp(model, case, device, request):
    if device == "cuda":
        require_cuda()
    path = IQ4 if model == "iq4-mix" else request.getfixturevalue("gemma_path")
    fx = np.load(FIXTURE / f"{model}__{case}.npz")
    first = json.loads(str(fx["meta_json"]))["prompt_logits_from"]
    max_abs, mean_abs, top1_prompt, top1_decode = BOUNDS[model]
    sess = minfer._minfer.Session(minfer._minfer.Model(str(path)), threads=2, device=device)
    prompt = fx["prompt_ids"]
    ours = sess.eval(prompt, 0, all_logits=True)[first:]
    ref = fx["prompt_logits"]
    assert np.abs(ours - ref).max() <= max_abs and np.abs(ours - ref).mean() <= mean_abs, np.abs(ours - ref).max()
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= top1_prompt
    ours = np.stack([sess.eval(np.array([g], np.int32), len(prompt) + k)[0] for k, g in enumerate(fx["gen_ids"])])
    ref = fx["decode_logits"]
    assert np.abs(ours - ref).max() <= max_abs and np.abs(ours - ref).mean() <= mean_abs, np.abs(ours - ref).max()
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= top1_decode
