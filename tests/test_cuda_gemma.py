"""Gemma 3's ops on the CUDA backend against the reference backend (float64), at its shapes and on the
weights of gemma-3-270m's layout (real types and shapes, random weights: the real file does not travel to
the GPU machine).  Needs an NVIDIA GPU; skips, saying why, where there is none.

Whole forward passes are not compared here: on the random layout the model amplifies rounding chaotically
(the CPU and the float64 reference backend, on the same 8-bit activations, differ by 60 % of the logits'
scale), so no bound there could tell a bug from noise."""
import numpy as np
import pytest

from backend_compare import close, run_both
from conftest import layout_model, require_cuda
from cuda_cases import M, q15, _gpu  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu

LAYOUT = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="module")
def gemma():
    """gemma-3-270m's layout and a CUDA session over it."""
    require_cuda()
    m = M.Model(str(layout_model(LAYOUT)))
    return m, M.Session(m, threads=4, device="cuda")


@pytest.mark.parametrize("window", [512, 100])
@pytest.mark.parametrize("rows,first", [(1, 700), (3, 40), (300, 200)], ids=["decode-split", "decode3", "prefill"])
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0"])
def test_sliding_window_attention(q15, rng, kv_type, rows, first, window):
    """Gemma's local layers (4 heads on 1 KV head of 256): a row at p sees keys p - window < j <= p.  Decode
    at 700 over 1024 cells runs 8 splits of 128, some wholly before a window of 100 (empty partials for the
    combine); prefill rows cross chunk edges and the window's start."""
    m, s = q15
    n_head, n_head_kv, head_dim, n_ctx = 4, 1, 256, 1024
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((rows, head_dim)) * 0.3).astype(np.float32)
    v = rng.standard_normal((rows, head_dim)).astype(np.float32)
    pos = (np.arange(rows) + first).astype(np.int32).reshape(rows, 1)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type=kv_type, n_ctx=n_ctx,
                attn_scale=1 / 16, window=window, layer=0)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=rows, cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 3, 4], rows=rows, cols=n_head * head_dim, meta=meta)]
    gpu, ref = run_both(s, [q, k, v, pos], nodes, "cuda")
    close(gpu, ref, 1e-5)


@pytest.mark.parametrize("n", [1, 2, 20, 100])
def test_gelu_ffn_matches_unfused(gemma, rng, n):
    """gate + up + GELU in one node (the matvec's epilogue for 1-2 rows, the GEMMs then the GeGLU kernel
    beyond) against the reference's separate nodes; the bound as test_cuda's SwiGLU case."""
    m, s = gemma
    x = rng.standard_normal((n, 640)).astype(np.float32)
    L = "blk.3."
    ffn = s.run_ops("cuda", [x], [dict(op="FusedFFN", inputs=[0], rows=n, cols=2048,
                                       meta=dict(w_gate=L + "ffn_gate.weight", w_up=L + "ffn_up.weight", act="gelu"))])[-1]
    ref = s.run_ops("reference", [x], [
        dict(op="MatMul", inputs=[0], rows=n, cols=2048, meta=dict(weight=L + "ffn_gate.weight")),
        dict(op="MatMul", inputs=[0], rows=n, cols=2048, meta=dict(weight=L + "ffn_up.weight")),
        dict(op="GeGLU", inputs=[1, 2], rows=n, cols=2048)])[-1]
    close(ffn, ref, 3e-2)
