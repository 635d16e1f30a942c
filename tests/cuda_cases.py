"""What the CUDA tests share: the GPU requirement and the 1.5B layout session (fixtures), weight rows of
each type, the 1.5B layout's fused decode launches, a forward pass of several steps."""
import numpy as np
import pytest

import minfer
from conftest import layout_model, require_cuda

M = minfer._minfer
U = 2.0 ** -24   # f32 unit roundoff
UH = 2.0 ** -11  # f16 unit roundoff
UB = 2.0 ** -8   # bf16 unit roundoff

# type id: (values per block, bytes per block, offsets of f16 scale fields, typical scale)
TYPES = {
    "f32": (0, 1, 4, [], 0), "f16": (1, 1, 2, [], 0),
    "q4_0": (2, 32, 18, [0], 5e-3), "q4_1": (3, 32, 20, [0, 2], 3e-3), "q5_0": (6, 32, 22, [0], 2.5e-3),
    "q5_1": (7, 32, 24, [0, 2], 1.5e-3), "q8_0": (8, 32, 34, [0], 3e-4), "q4_k": (12, 256, 144, [0, 2], 1e-3),
    "q5_k": (13, 256, 176, [0, 2], 5e-4), "q6_k": (14, 256, 210, [208], 2e-4),
    "iq4_nl": (20, 32, 18, [0], 2e-4), "iq4_xs": (23, 256, 136, [0], 1e-5), "bf16": (30, 1, 2, [], 0),
}


def random_weight(name, n, k, rng):
    """Valid GGUF rows of a type: random quants, scales drawn around a realistic magnitude."""
    t, bv, bb, f16s, scale = TYPES[name]
    if name == "f32":
        return t, (rng.standard_normal((n, k)) * 0.02).astype(np.float32).view(np.uint8)
    if name == "f16":
        return t, (rng.standard_normal((n, k)) * 0.02).astype(np.float16).view(np.uint8)
    if name == "bf16":
        bits = (rng.standard_normal((n, k)) * 0.02).astype(np.float32).view(np.uint32) >> 16
        return t, bits.astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=(n, k // bv, bb), dtype=np.uint8)
    for off in f16s:
        s = (rng.uniform(0.5, 1.5, size=(n, k // bv)) * scale).astype(np.float16)
        raw[:, :, off:off + 2] = s.view(np.uint8).reshape(n, k // bv, 2)
    return t, raw.reshape(n, -1)


@pytest.fixture(autouse=True)
def _gpu():
    """Every CUDA test skips, saying why, where there is no GPU (a module imports this fixture)."""
    require_cuda()


@pytest.fixture(scope="module")
def q15():
    """The qwen2.5-coder-1.5b layout (hidden 1536, 12 heads / 2 KV heads of 128, ffn 8960, vocab 151936) and a
    CUDA session over it."""
    require_cuda()
    m = M.Model(str(layout_model("qwen2.5-coder-1.5b-instruct-q4_k_m")))
    return m, M.Session(m, threads=4, device="cuda")


def fused_decode_nodes(L):
    """The 1.5B layout's decode launches of several parts in layer L ("blk.5."): q, k and v, and gate and up with
    SwiGLU, as run_ops nodes over one input row."""
    return [dict(op="FusedQKV", inputs=[0], rows=1, cols=1536 + 512, meta=dict(
        wq=L + "attn_q.weight", wk=L + "attn_k.weight", wv=L + "attn_v.weight", bq=L + "attn_q.bias",
        bk=L + "attn_k.bias", bv=L + "attn_v.bias", q_cols=1536, k_cols=256, v_cols=256)),
            dict(op="FusedFFN", inputs=[0], rows=1, cols=8960,
                 meta=dict(w_gate=L + "ffn_gate.weight", w_up=L + "ffn_up.weight"))]


def forward(model, device, prompt, steps, **kw):
    s = M.Session(model, threads=4, n_ctx=kw.pop("n_ctx", 256), device=device, **kw)
    out = [s.eval(prompt, 0, all_logits=True)]
    pos, tok = len(prompt), int(np.argmax(out[0][-1]))
    for _ in range(steps):
        out.append(s.eval(np.array([tok], np.int32), pos))
        pos += 1
        tok = int(np.argmax(out[-1][-1]))
    return np.concatenate(out), s
