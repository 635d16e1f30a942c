"""Rung 1-2 for the graph ops: every op on the CPU backend against the
reference backend (float64, scalar), through the real scheduler (a hand-built
graph per case), at real model shapes, random inputs, poisoned outputs.

Tolerances: ops whose CPU kernel rounds differently from float64 only in the
last bits are held to a few float32 ulps relative to the data's scale; MatMul to
the float rounding bound of its dot products (see tests/test_dot.py); attention
to 1e-5 of the value scale (f32 softmax and accumulation vs float64)."""
import numpy as np
import pytest

import minfer
from attention_ref import causal_attention_f64
from backend_compare import ELEMENTWISE, check_elementwise, check_rope, close, run_both
from conftest import real_model, synthetic_model
from minfer.quants import available_isas, dequantize, geglu, quantize_act, swiglu, type_info, vec_dot_type

U = 2.0 ** -24


@pytest.fixture(scope="module")
def q15():
    # the 1.5B model: hidden 1536, 12 heads / 2 KV heads of 128, ffn 8960, vocab 151936
    m = minfer._minfer.Model(str(real_model("qwen2.5-coder-1.5b")))
    return m, minfer._minfer.Session(m, threads=2, assignment="alternate:1")


@pytest.fixture(scope="module")
def q05():
    m = minfer._minfer.Model(str(real_model("qwen2.5-coder-0.5b")))
    return m, minfer._minfer.Session(m, threads=2, assignment="alternate:1")


@pytest.fixture(scope="module")
def smol():
    m = minfer._minfer.Model(str(real_model("smollm2-135m")))
    return m, minfer._minfer.Session(m, threads=2, assignment="alternate:1")


@pytest.fixture(scope="module")
def gemma():
    # Gemma 3 270M: hidden 640, 4 heads / 1 KV head of 256, ffn 2048, local layers with a 512 window
    m = minfer._minfer.Model(str(real_model("gemma3-270m")))
    return m, minfer._minfer.Session(m, threads=2, assignment="alternate:1")


@pytest.fixture(scope="module")
def qwen3():
    m = minfer._minfer.Model(str(synthetic_model("qwen3-tiny-q8_0")))
    return m, minfer._minfer.Session(m, threads=2, assignment="alternate:1")


def both(sess, inputs, nodes):
    return run_both(sess, inputs, nodes, "cpu")


def test_rmsnorm(q15, rng):
    m, s = q15
    for n in (1, 9):
        x = (rng.standard_normal((n, 1536)) * 3).astype(np.float32)
        cpu, ref = both(s, [x], [dict(op="RmsNorm", inputs=[0], rows=n, cols=1536,
                                      meta=dict(weight="blk.3.attn_norm.weight", eps=1e-6))])
        close(cpu, ref, 8 * U)


def test_qknorm(qwen3, rng):
    m, s = qwen3
    x = rng.standard_normal((5, 256)).astype(np.float32)
    cpu, ref = both(s, [x], [dict(op="QkNorm", inputs=[0], rows=5, cols=256,
                                  meta=dict(weight="blk.1.attn_q_norm.weight", eps=1e-6, head_dim=64))])
    close(cpu, ref, 8 * U)


@pytest.mark.parametrize("scale", [1.0, 0.125])  # 0.125: linear RoPE scaling by 8 (gemma3 4B+'s global layers)
@pytest.mark.parametrize("neox,head_dim,rope_dim", [(True, 128, 128), (False, 64, 64), (True, 64, 32)])
def test_rope(q15, rng, neox, head_dim, rope_dim, scale):
    check_rope(q15[1], "cpu", rng, neox, head_dim, rope_dim, scale)


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_elementwise(q15, rng, op):
    check_elementwise(q15[1], "cpu", rng, op)


@pytest.mark.parametrize("isa", available_isas())
def test_swiglu_kernel(isa, rng):
    """Each ISA's FFN gate (the elementwise op above runs only the default ISA's) within 4 f32 ulps of
    float64 silu(g) * u, over a real FFN's range and past exp's float limits, at a length that leaves a tail
    after the vector loop; results below 1e-30 (e^-g underflowing) within 1e-35."""
    g = np.concatenate([rng.standard_normal(20000) * 4, rng.uniform(-100, 100, 2003), [0.0, -0.0, 88.5, -88.5]])
    g = g.astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore"):
        ref = g64 / (1.0 + np.exp(-g64)) * u
    y = swiglu(g, u, isa).astype(np.float64)
    big = np.abs(ref) > 1e-30
    assert np.all(np.abs(y - ref)[big] <= 4 * U * np.abs(ref[big])), isa
    assert np.all(np.abs(y - ref)[~big] <= 1e-35), isa


@pytest.mark.parametrize("isa", available_isas())
def test_geglu_kernel(isa, rng):
    """Each ISA's gemma gate against float64 0.5 g (1 + tanh z) u, z = sqrt(2/pi) (g + 0.044715 g^3), written
    g u / (1 + e^(-2z)) (1 + tanh z cancels in float64 for z < -18).  The kernels compute that in f32:
    2z takes four roundings (up to 2 ulps of |2z|, which move e^(-2z) by 2 |2z| ulps relatively), then e^x,
    the sum, the quotient and the product: the bound is (8 + 4 |2z|) ulps of the value; results below 1e-30 within 1e-35."""
    g = np.concatenate([rng.standard_normal(20000) * 4, rng.uniform(-30, 30, 2003), [0.0, -0.0, 88.5, -88.5, -200, 200]])
    g = g.astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    g64 = g.astype(np.float64)
    z2 = 2 * np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64 ** 3)
    with np.errstate(over="ignore"):
        ref = g64 / (1 + np.exp(-z2)) * u
    y = geglu(g, u, isa).astype(np.float64)
    big = np.abs(ref) > 1e-30
    bound = (8 + 4 * np.abs(z2)) * U * np.abs(ref)
    assert np.all(np.abs(y - ref)[big] <= bound[big]), (isa, np.max((np.abs(y - ref) / bound)[big]))
    assert np.all(np.abs(y - ref)[~big] <= 1e-35), isa


def test_getrows_and_tailrow(q15, rng):
    m, s = q15
    ids = rng.integers(0, 151936, size=(6, 1)).astype(np.int32)
    cpu, ref = both(s, [ids], [dict(op="GetRows", inputs=[0], rows=6, cols=1536, meta=dict(weight="token_embd.weight")),
                               dict(op="TailRow", inputs=[1], rows=1, cols=1536, meta=dict(src_row=5))])
    assert np.array_equal(cpu, ref)
    emb = minfer.gguf.open(real_model("qwen2.5-coder-1.5b")).tensors["token_embd.weight"]
    assert np.array_equal(cpu[0], dequantize(emb.data[ids[-1, 0]], emb.type))


def matmul_bound(model_path, weight, x):
    """Per element: the dot products' float rounding bound 4 * n_terms * u * sum|w||a|."""
    t = minfer.gguf.open(model_path).tensors[weight]
    w = t.data
    at = vec_dot_type(t.type)
    a = np.stack([dequantize(quantize_act(r, at), at) for r in x]).astype(np.float64)
    S = np.zeros((x.shape[0], w.shape[0]))
    for r0 in range(0, w.shape[0], 8192):
        wd = dequantize(np.ascontiguousarray(w[r0:r0 + 8192]), t.type).reshape(-1, x.shape[1]).astype(np.float64)
        S[:, r0:r0 + wd.shape[0]] = np.abs(a) @ np.abs(wd).T
    n_terms = x.shape[1] // type_info(t.type)[1] + x.shape[1] // 16 + 8
    return 4 * n_terms * U * S + 1e-30


@pytest.mark.parametrize("fixture,weight,bias,n", [
    ("q15", "blk.0.attn_q.weight", "blk.0.attn_q.bias", 7),    # Q4_K 1536 x 1536 + bias
    ("q15", "blk.0.attn_v.weight", "blk.0.attn_v.bias", 1),    # Q6_K 256 x 1536
    ("q15", "blk.5.ffn_down.weight", "", 3),                   # Q6_K 1536 x 8960
    ("q15", "output.weight", "", 1),                           # Q6_K 151936 x 1536
    ("q05", "blk.0.ffn_gate.weight", "", 5),                   # Q5_0 4864 x 896
    ("q05", "output.weight", "", 2),                           # Q8_0 151936 x 896
    ("smol", "blk.2.ffn_up.weight", "", 4),                    # Q4_1 1536 x 576
])
def test_matmul(request, rng, fixture, weight, bias, n):
    m, s = request.getfixturevalue(fixture)
    name = {"q15": "qwen2.5-coder-1.5b", "q05": "qwen2.5-coder-0.5b", "smol": "smollm2-135m"}[fixture]
    info = minfer.gguf.open(real_model(name)).tensors[weight]
    rows, cols = info.shape
    x = rng.standard_normal((n, cols)).astype(np.float32)
    meta = dict(weight=weight)
    if bias:
        meta["bias"] = bias
    cpu, ref = both(s, [x], [dict(op="MatMul", inputs=[0], rows=n, cols=rows, meta=meta)])
    bound = matmul_bound(real_model(name), weight, x)
    assert np.all(np.abs(cpu - ref) <= bound + (np.abs(ref) * 4 * U if bias else 0)), np.abs(cpu - ref).max()


@pytest.mark.parametrize("n", [37, 1, 3], ids=["prefill", "decode", "decode3"])  # < 4 rows: the decode path
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0"])
@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(12, 2, 128), (9, 3, 64)])
def test_kvstore_attention(q15, rng, kv_type, n_head, n_head_kv, head_dim, n):
    m, s = q15
    n_ctx = 64
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((n, n_head_kv * head_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((n, n_head_kv * head_dim)).astype(np.float32)
    pos = (np.arange(n) + 20).astype(np.int32).reshape(n, 1)  # positions 20..56 of a 64-cell cache
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type=kv_type, n_ctx=n_ctx,
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=n, cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 3, 4], rows=n, cols=n_head * head_dim, meta=meta)]
    # cells 0..19 were never written: zero-filled, and attended to (causal over 0..pos)
    cpu, ref = both(s, [q, k, v, pos], nodes)
    close(cpu, ref, 1e-5)
    # an independent check of the math (f32 cache: exact softmax attention over the stored rows)
    if kv_type == "f32":
        K = np.zeros((n_ctx, n_head_kv * head_dim)); V = np.zeros_like(K)
        K[20:20 + n], V[20:20 + n] = k, v
        g = n_head // n_head_kv
        for r in (0, n - 1):
            for h in (0, n_head - 1):
                kh = slice((h // g) * head_dim, (h // g + 1) * head_dim)
                sc = K[: pos[r, 0] + 1, kh] @ q[r, h * head_dim:(h + 1) * head_dim] / np.sqrt(head_dim)
                p = np.exp(sc - sc.max()); p /= p.sum()
                assert np.allclose(cpu[r, h * head_dim:(h + 1) * head_dim], p @ V[: pos[r, 0] + 1, kh], atol=1e-5)


@pytest.mark.parametrize("n_ctx", [16384, 32768])
def test_attention_at_long_context(q15, rng, n_ctx):
    """A full f16 cache of 16k or 32k positions (12 query heads over 2 KV heads of 128): one decode row at
    the end, 16 prefill rows before it and 8 rows at random positions, against float64 over the stored
    (f16-rounded) rows.  Keys are scaled so each row's weight sits on a few positions: a 32-position chunk
    skipped anywhere moves some row far past the bound."""
    m, s = q15
    n_head, n_head_kv, head_dim = 12, 2, 128
    dim = n_head_kv * head_dim
    k = (rng.standard_normal((n_ctx, dim)) * 4).astype(np.float32)
    v = rng.standard_normal((n_ctx, dim)).astype(np.float32)
    pos = np.concatenate([np.sort(rng.choice(n_ctx - 17, 8, replace=False)), np.arange(n_ctx - 17, n_ctx)])
    q = rng.standard_normal((len(pos), n_head * head_dim)).astype(np.float32)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type="f16", n_ctx=n_ctx,
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=n_ctx, cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 4, 5], rows=len(pos), cols=n_head * head_dim, meta=meta)]
    all_pos = np.arange(n_ctx, dtype=np.int32).reshape(-1, 1)
    out = s.run_ops("cpu", [q, k, v, all_pos, pos.astype(np.int32).reshape(-1, 1)], nodes)[-1]
    kd, vd = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
    ref = causal_attention_f64(q, kd, vd, pos, n_head, n_head_kv, head_dim)
    close(out, ref, 1e-5)


@pytest.mark.parametrize("window", [5, 32, 40])
@pytest.mark.parametrize("n", [45, 1], ids=["prefill", "decode"])
def test_sliding_window_attention(gemma, rng, window, n):
    """Gemma's local layers: a query at p sees keys p - window < j <= p.  Its shape (4 heads on 1 KV head of
    256), windows shorter and longer than a 32-key chunk and not aligned to one, against the reference and
    an independent float64 softmax over exactly the window's keys."""
    m, s = gemma
    n_head, n_head_kv, head_dim, n_ctx = 4, 1, 256, 128
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((n, head_dim)) * 0.3).astype(np.float32)
    v = rng.standard_normal((n, head_dim)).astype(np.float32)
    pos = (np.arange(n) + 60).astype(np.int32).reshape(n, 1)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type="f32", n_ctx=n_ctx,
                attn_scale=1 / 16, window=window, layer=0)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=n, cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 3, 4], rows=n, cols=n_head * head_dim, meta=meta)]
    cpu, ref = both(s, [q, k, v, pos], nodes)
    close(cpu, ref, 1e-5)
    K = np.zeros((n_ctx, head_dim)); V = np.zeros_like(K)
    K[60:60 + n], V[60:60 + n] = k, v  # cells 0..59 zero-filled: inside early windows, they count
    for r in range(n):
        lo, p = max(0, pos[r, 0] - window + 1), pos[r, 0]
        for h in range(n_head):
            sc = K[lo:p + 1] @ q[r, h * head_dim:(h + 1) * head_dim] / 16
            w = np.exp(sc - sc.max()); w /= w.sum()
            assert np.allclose(cpu[r, h * head_dim:(h + 1) * head_dim], w @ V[lo:p + 1], atol=1e-5), (r, h)


def test_gelu_ffn_matches_unfused(gemma, rng):
    m, s = gemma
    x = rng.standard_normal((3, 640)).astype(np.float32)
    L = "blk.2."
    ffn = s.run_ops("cpu", [x], [dict(op="FusedFFN", inputs=[0], rows=3, cols=2048,
                                      meta=dict(w_gate=L + "ffn_gate.weight", w_up=L + "ffn_up.weight", act="gelu"))])[-1]
    ref = s.run_ops("reference", [x], [
        dict(op="MatMul", inputs=[0], rows=3, cols=2048, meta=dict(weight=L + "ffn_gate.weight")),
        dict(op="MatMul", inputs=[0], rows=3, cols=2048, meta=dict(weight=L + "ffn_up.weight")),
        dict(op="Gelu", inputs=[1], rows=3, cols=2048),
        dict(op="Mul", inputs=[3, 2], rows=3, cols=2048)])[-1]
    close(ffn, ref, 1e-5)


def test_fused_qkv_and_ffn_match_unfused(q15, rng):
    # fused ops exist only on the CPU: compare them with the reference's unfused nodes
    m, s = q15
    x = rng.standard_normal((3, 1536)).astype(np.float32)
    L = "blk.4."
    fused = s.run_ops("cpu", [x], [dict(op="FusedQKV", inputs=[0], rows=3, cols=1536 + 512, meta=dict(
        wq=L + "attn_q.weight", wk=L + "attn_k.weight", wv=L + "attn_v.weight", bq=L + "attn_q.bias",
        bk=L + "attn_k.bias", bv=L + "attn_v.bias", q_cols=1536, k_cols=256, v_cols=256))])[-1]
    parts = [s.run_ops("reference", [x], [dict(op="MatMul", inputs=[0], rows=3, cols=c,
                                               meta=dict(weight=L + f"attn_{p}.weight", bias=L + f"attn_{p}.bias"))])[-1]
             for p, c in (("q", 1536), ("k", 256), ("v", 256))]
    close(fused, np.concatenate(parts, 1), 1e-5)
    ffn = s.run_ops("cpu", [x], [dict(op="FusedFFN", inputs=[0], rows=3, cols=8960,
                                      meta=dict(w_gate=L + "ffn_gate.weight", w_up=L + "ffn_up.weight"))])[-1]
    ref = s.run_ops("reference", [x], [
        dict(op="MatMul", inputs=[0], rows=3, cols=8960, meta=dict(weight=L + "ffn_gate.weight")),
        dict(op="MatMul", inputs=[0], rows=3, cols=8960, meta=dict(weight=L + "ffn_up.weight")),
        dict(op="SwiGLU", inputs=[1, 2], rows=3, cols=8960)])[-1]
    close(ffn, ref, 1e-5)


def test_fused_qkv_norm_matches_unfused(qwen3, rng):
    m, s = qwen3
    x = rng.standard_normal((2, 128)).astype(np.float32)
    L = "blk.0."
    fused = s.run_ops("cpu", [x], [dict(op="FusedQkvNorm", inputs=[0], rows=2, cols=256 + 128 + 128, meta=dict(
        wq=L + "attn_q.weight", wk=L + "attn_k.weight", wv=L + "attn_v.weight", q_norm=L + "attn_q_norm.weight",
        k_norm=L + "attn_k_norm.weight", q_cols=256, k_cols=128, v_cols=128, head_dim=64, eps=1e-6))])[-1]
    ref = s.run_ops("reference", [x], [
        dict(op="MatMul", inputs=[0], rows=2, cols=256, meta=dict(weight=L + "attn_q.weight")),
        dict(op="MatMul", inputs=[0], rows=2, cols=128, meta=dict(weight=L + "attn_k.weight")),
        dict(op="MatMul", inputs=[0], rows=2, cols=128, meta=dict(weight=L + "attn_v.weight")),
        dict(op="QkNorm", inputs=[1], rows=2, cols=256, meta=dict(weight=L + "attn_q_norm.weight", eps=1e-6, head_dim=64)),
        dict(op="QkNorm", inputs=[2], rows=2, cols=128, meta=dict(weight=L + "attn_k_norm.weight", eps=1e-6, head_dim=64)),
    ])
    close(fused, np.concatenate([ref[4], ref[5], ref[3]], 1), 1e-5)


def test_bad_token_id_is_an_error(q15):
    m, s = q15
    with pytest.raises(minfer.MinferError, match="token id 151936 is out of range for 'token_embd.weight'"):
        s.run_ops("cpu", [np.array([[151936]], np.int32)],
                  [dict(op="GetRows", inputs=[0], rows=1, cols=1536, meta=dict(weight="token_embd.weight"))])
