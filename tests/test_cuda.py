"""The CUDA backend's correctness ladder (issue 6).  Every test here needs an
NVIDIA GPU and skips, saying why, where there is none (CI).

Rung 1: each op against the reference backend (float64) through the real
scheduler (the matmul kernels against float64: test_cuda_matvec.py; the
attention kernels: test_cuda_attention.py).  Rung 2/3: whole forward passes
against the CPU backend and llama.cpp's logits (tests/test_llamacpp_synthetic.py
runs its cases on CUDA too).  Then the things only a GPU has: graph replay,
bounded waits, mixed CPU/GPU graphs (compute-sanitizer: test_cuda_sanitizer.py).

Layout models (real types and shapes, random weights) come from the headers in
../shared/fixtures/layouts; see conftest.layout_model."""
import numpy as np
import pytest

import minfer
from backend_compare import ELEMENTWISE, check_elementwise, check_rope, close, run_both
from conftest import layout_model, nan_logits_model, require_cuda, synthetic_model
from cuda_cases import M, U, forward, fused_decode_nodes, q15, random_weight, _gpu  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu


# ---- rung 1: the other ops against the reference backend --------------------------------------

@pytest.fixture(scope="module")
def qwen3():
    require_cuda()
    m = M.Model(str(synthetic_model("qwen3-tiny-q8_0")))
    return m, M.Session(m, threads=2, device="cuda")


def both(sess, inputs, nodes):
    return run_both(sess, inputs, nodes, "cuda")


def test_rmsnorm(q15, rng):
    m, s = q15
    for n in (1, 9):
        x = (rng.standard_normal((n, 1536)) * 3).astype(np.float32)
        gpu, ref = both(s, [x], [dict(op="RmsNorm", inputs=[0], rows=n, cols=1536,
                                      meta=dict(weight="blk.3.attn_norm.weight", eps=1e-6))])
        close(gpu, ref, 16 * U)  # n = 1: decode's float4 kernel (add_rmsnorm_f4 without a residual); 9: the scalar one


def test_qknorm(qwen3, rng):
    m, s = qwen3
    x = rng.standard_normal((5, 256)).astype(np.float32)
    gpu, ref = both(s, [x], [dict(op="QkNorm", inputs=[0], rows=5, cols=256,
                                  meta=dict(weight="blk.1.attn_q_norm.weight", eps=1e-6, head_dim=64))])
    close(gpu, ref, 16 * U)


@pytest.mark.parametrize("neox,head_dim,rope_dim", [(True, 128, 128), (False, 64, 64), (True, 64, 32), (False, 128, 64)])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_rope(q15, rng, neox, head_dim, rope_dim, scale):
    check_rope(q15[1], "cuda", rng, neox, head_dim, rope_dim, scale)


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_elementwise(q15, rng, op):
    check_elementwise(q15[1], "cuda", rng, op)


def test_getrows_and_tailrow(q15, rng):
    m, s = q15
    ids = rng.integers(0, 151936, size=(6, 1)).astype(np.int32)
    gpu, ref = both(s, [ids], [dict(op="GetRows", inputs=[0], rows=6, cols=1536, meta=dict(weight="token_embd.weight")),
                               dict(op="TailRow", inputs=[1], rows=1, cols=1536, meta=dict(src_row=5))])
    assert np.array_equal(gpu, ref)  # the same dequantization, rounded the same way
    # output.weight is Q6_K: rows of 6 blocks (1260 bytes) the device pads to 1264 and rotates (q6k_layout.cuh)
    assert minfer.gguf.open(str(layout_model("qwen2.5-coder-1.5b-instruct-q4_k_m"))).tensors["output.weight"].type == 14
    ids = np.concatenate([ids, [[0], [1], [151935]]]).astype(np.int32)  # the first rows and the last
    gpu, ref = both(s, [ids], [dict(op="GetRows", inputs=[0], rows=9, cols=1536, meta=dict(weight="output.weight"))])
    assert np.array_equal(gpu, ref)


def test_matmul_node_with_bias(q15, rng):
    m, s = q15
    for n in (1, 40):  # matvec and tensor-core paths, bias added in both
        x = rng.standard_normal((n, 1536)).astype(np.float32)
        gpu, ref = both(s, [x], [dict(op="MatMul", inputs=[0], rows=n, cols=1536,
                                      meta=dict(weight="blk.0.attn_q.weight", bias="blk.0.attn_q.bias"))])
        # the reference rounds x to q8 (the CPU's activation format): its own error dominates
        close(gpu, ref, 2e-2)


@pytest.mark.parametrize("n,kernel", [(1, "block"), (1, "warp"), (3, ""), (20, "")],
                         ids=["decode-block", "decode-warp", "decode3", "prefill"])
def test_fused_qkv_and_ffn_match_unfused(q15, rng, force, n, kernel):
    """One launch for q, k, v (types Q4_K/Q4_K/Q6_K here) and one for gate+up+SwiGLU,
    against the reference's separate nodes (bound as test_matmul_node_with_bias).  One row
    takes either one-row kernel (the block one: 4 gate and 4 up rows a block with SwiGLU)."""
    if kernel:
        force("cuda.matvec", kernel)
    m, s = q15
    x = rng.standard_normal((n, 1536)).astype(np.float32)
    L = "blk.5."  # its v is Q6_K
    fused = s.run_ops("cuda", [x], [dict(op="FusedQKV", inputs=[0], rows=n, cols=1536 + 512, meta=dict(
        wq=L + "attn_q.weight", wk=L + "attn_k.weight", wv=L + "attn_v.weight", bq=L + "attn_q.bias",
        bk=L + "attn_k.bias", bv=L + "attn_v.bias", q_cols=1536, k_cols=256, v_cols=256))])[-1]
    parts = [s.run_ops("reference", [x], [dict(op="MatMul", inputs=[0], rows=n, cols=c,
                                               meta=dict(weight=L + f"attn_{p}.weight", bias=L + f"attn_{p}.bias"))])[-1]
             for p, c in (("q", 1536), ("k", 256), ("v", 256))]
    for (a, b), ref in zip(((0, 1536), (1536, 1792), (1792, 2048)), parts):
        close(fused[:, a:b], ref, 2e-2)
    ffn = s.run_ops("cuda", [x], [dict(op="FusedFFN", inputs=[0], rows=n, cols=8960,
                                       meta=dict(w_gate=L + "ffn_gate.weight", w_up=L + "ffn_up.weight"))])[-1]
    ref = s.run_ops("reference", [x], [
        dict(op="MatMul", inputs=[0], rows=n, cols=8960, meta=dict(weight=L + "ffn_gate.weight")),
        dict(op="MatMul", inputs=[0], rows=n, cols=8960, meta=dict(weight=L + "ffn_up.weight")),
        dict(op="SwiGLU", inputs=[1, 2], rows=n, cols=8960)])[-1]
    close(ffn, ref, 3e-2)


def test_pipe_kernel_on_fused_parts(q15, rng, force):
    """The pipe kernel on the decode launches with several parts -- q, k and v of types Q4_K / Q4_K / Q6_K in
    one launch, gate and up with SwiGLU -- gives the block kernel's bits, loading one chunk ahead or two."""
    m, s = q15
    x = rng.standard_normal((1, 1536)).astype(np.float32)
    L = "blk.5."
    nodes = fused_decode_nodes(L)
    g = minfer.gguf.open(str(layout_model("qwen2.5-coder-1.5b-instruct-q4_k_m")))
    assert [g.tensors[L + f"attn_{p}.weight"].type for p in "qkv"] == [12, 12, 14]  # Q4_K, Q4_K, Q6_K
    force("cuda.matvec", "block")
    out = {}
    for v, ahead in (("0", "auto"), ("1", "1"), ("1", "2"), ("1", "whole")):
        force("cuda.matvec_pipe", v)
        force("cuda.pipe_ahead", ahead)
        out[v + ahead] = s.run_ops("cuda", [x], nodes)
    for key in ("11", "12", "1whole"):
        for a, b in zip(out["0auto"], out[key]):
            assert np.array_equal(a, b), key


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0"])
@pytest.mark.parametrize("neox,head_dim,rope_dim", [(True, 128, 128), (False, 64, 32)])
def test_rope_kv_store_matches_unfused(q15, rng, rows, kv_type, neox, head_dim, rope_dim):
    """The decode fusion (RoPE of q and k + the KV store in one kernel) does the same arithmetic as the
    separate Rope and KvStore kernels: rotated q and the attention over the stored cache are identical."""
    m, s = q15
    n_head, n_head_kv, n_ctx = 12, 2, 1024
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((rows, n_head_kv * head_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((rows, n_head_kv * head_dim)).astype(np.float32)
    pos = (np.arange(rows) + 600).astype(np.int32).reshape(rows, 1)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type=kv_type, n_ctx=n_ctx,
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0, rope_dim=rope_dim, rope_base=1e6, rope_neox=neox)
    qc, kc = n_head * head_dim, n_head_kv * head_dim
    unfused = s.run_ops("cuda", [q, k, v, pos], [
        dict(op="Rope", inputs=[0, 3], rows=rows, cols=qc, meta=meta),
        dict(op="Rope", inputs=[1, 3], rows=rows, cols=kc, meta=meta),
        dict(op="KvStore", inputs=[5, 2, 3], rows=rows, cols=1, meta=meta),
        dict(op="Attn", inputs=[4, 3, 6], rows=rows, cols=qc, meta=meta)])
    fused = s.run_ops("cuda", [q, k, v, pos], [
        dict(op="RopeKvStore", inputs=[0, 1, 2, 3], rows=rows, cols=qc, meta=meta),
        dict(op="Attn", inputs=[4, 3, 4], rows=rows, cols=qc, meta=meta)])
    assert np.array_equal(fused[4], unfused[4])  # rotated q
    assert np.array_equal(fused[5], unfused[7])  # attention over the cache the fused kernel wrote
    with pytest.raises(minfer.MinferError, match="position"):
        s.run_ops("cuda", [q, k, v, pos + n_ctx], [
            dict(op="RopeKvStore", inputs=[0, 1, 2, 3], rows=rows, cols=qc, meta=meta)])


def qkv_rope_case(rng, rows, kv_type, neox, pos0=600):
    """The 1.5B layout's layer 5 (q, k Q4_K; v Q6_K; biases): (inputs, the FusedQKV + RopeKvStore + Attn nodes,
    the FusedQkvRope + Attn nodes)."""
    L, n_ctx = "blk.5.", 1024
    meta = dict(wq=L + "attn_q.weight", wk=L + "attn_k.weight", wv=L + "attn_v.weight", bq=L + "attn_q.bias",
                bk=L + "attn_k.bias", bv=L + "attn_v.bias", q_cols=1536, k_cols=256, v_cols=256, n_head=12,
                n_head_kv=2, head_dim=128, kv_type=kv_type, n_ctx=n_ctx, attn_scale=float(1 / np.sqrt(128)),
                layer=0, rope_dim=128, rope_base=1e6, rope_neox=neox)
    x = rng.standard_normal((rows, 1536)).astype(np.float32)
    pos = (np.arange(rows) + pos0).astype(np.int32).reshape(rows, 1)
    unfused = [dict(op="FusedQKV", inputs=[0], rows=rows, cols=2048, meta=meta),
               dict(op="RopeKvStore", inputs=[(2, 0, 1536), (2, 1536, 256), (2, 1792, 256), 1], rows=rows, cols=1536,
                    meta=meta),
               dict(op="Attn", inputs=[3, 1, 3], rows=rows, cols=1536, meta=meta)]
    fused = [dict(op="FusedQkvRope", inputs=[0, 1], rows=rows, cols=2048, meta=meta),
             dict(op="Attn", inputs=[(2, 0, 1536), 1, 2], rows=rows, cols=1536, meta=meta)]
    return [x, pos], unfused, fused


@pytest.mark.parametrize("rows,kv_type,neox,path", [(1, "f16", True, "epilogue"), (1, "f32", False, "epilogue"),
                                                    (1, "q8_0", True, "kernel"), (3, "f16", True, "kernel")])
def test_qkv_rope_matches_unfused(q15, rng, force, rows, kv_type, neox, path):
    """FusedQkvRope -- the q/k/v projection whose decode matvec rotates q and k and stores k and v in its
    epilogue -- gives the bits of FusedQKV + RopeKvStore: q rotated, k and v as projected, and the attention
    over the cache it wrote.  One row with an f16/f32 cache takes the epilogue (cuda.qkv_rope=epilogue
    makes any other path an error, so the test shows which path ran); a q8_0 cache (a row block spans other
    blocks' rows) or several rows run the projection, then the rope_kv_store kernel."""
    m, s = q15
    inputs, unfused_nodes, fused_nodes = qkv_rope_case(rng, rows, kv_type, neox)
    unfused = s.run_ops("cuda", inputs, unfused_nodes)
    if path == "epilogue":
        force("cuda.qkv_rope", "epilogue")
    for ahead in ("auto", "1", "2", "whole"):  # every build of the pipe kernel's epilogue
        force("cuda.pipe_ahead", ahead)
        fused = s.run_ops("cuda", inputs, fused_nodes)
        assert np.array_equal(fused[2][:, :1536], unfused[3]), ahead   # rotated q
        assert np.array_equal(fused[2][:, 1536:], unfused[2][:, 1536:]), ahead  # k, v as projected
        assert np.array_equal(fused[3], unfused[4]), ahead  # attention over the cache the fused node wrote
    force("cuda.pipe_ahead", "auto")
    force("cuda.qkv_rope", "epilogue")
    if path == "kernel" and rows == 1:
        with pytest.raises(minfer.MinferError, match="cannot rotate and store"):
            s.run_ops("cuda", inputs, fused_nodes)
    force("cuda.qkv_rope", "epilogue" if path == "epilogue" else "1")
    bad = [inputs[0], inputs[1] + 1024]
    with pytest.raises(minfer.MinferError, match="position"):
        s.run_ops("cuda", bad, fused_nodes[:1])


@pytest.mark.parametrize("rows,path", [(1, "epilogue"), (3, "kernel")])
def test_qkv_rope_stores_at_pool_rows(q15, rng, force, rows, path):
    """A batch step's FusedQkvRope (its third input: each token's pool row) rotates q and k at the positions and
    stores k and v at the pool rows -- in the decode matvec's epilogue (one row) or by rope_kv_store after the
    product -- with the bits of FusedQKV, two Ropes and a KvStore at those rows; the paged attention through
    the shuffled block table reads what each wrote."""
    m, s = q15
    (x, pos), _, _ = qkv_rope_case(rng, rows, "f16", True)
    bs, n_blocks = 16, 64
    table = rng.permutation(n_blocks).astype(np.int32).reshape(1, n_blocks)
    slots = (table[0, pos // bs] * bs + pos % bs).astype(np.int32)
    seq = np.zeros((rows, 1), np.int32)
    L = "blk.5."
    meta = dict(wq=L + "attn_q.weight", wk=L + "attn_k.weight", wv=L + "attn_v.weight", bq=L + "attn_q.bias",
                bk=L + "attn_k.bias", bv=L + "attn_v.bias", q_cols=1536, k_cols=256, v_cols=256, n_head=12,
                n_head_kv=2, head_dim=128, kv_type="f16", n_ctx=n_blocks * bs, attn_scale=float(1 / np.sqrt(128)),
                layer=0, rope_dim=128, rope_base=1e6, rope_neox=True, block_size=bs)
    inputs = [x, pos, slots, seq, table]
    unfused = s.run_ops("cuda", inputs, [
        dict(op="FusedQKV", inputs=[0], rows=rows, cols=2048, meta=meta),
        dict(op="Rope", inputs=[(5, 0, 1536), 1], rows=rows, cols=1536, meta=meta),
        dict(op="Rope", inputs=[(5, 1536, 256), 1], rows=rows, cols=256, meta=meta),
        dict(op="KvStore", inputs=[7, (5, 1792, 256), 2], rows=rows, cols=1, meta=meta),
        dict(op="Attn", inputs=[6, 1, 8, 3, 4], rows=rows, cols=1536, meta=meta)])
    force("cuda.qkv_rope", "epilogue" if path == "epilogue" else "1")
    fused = s.run_ops("cuda", inputs, [
        dict(op="FusedQkvRope", inputs=[0, 1, 2], rows=rows, cols=2048, meta=meta),
        dict(op="Attn", inputs=[(5, 0, 1536), 1, 5, 3, 4], rows=rows, cols=1536, meta=meta)])
    assert np.array_equal(fused[5][:, :1536], unfused[6])  # q rotated at the positions
    assert np.array_equal(fused[6], unfused[9])  # the attention over the rows each stored


@pytest.mark.parametrize("n_ctx", [64, 8448], ids=["warp-attention", "tc-attention"])
@pytest.mark.parametrize("layout", ["qwen2.5-coder-1.5b-instruct-q4_k_m", "deepseek-r1-distill-qwen-7b-q4_k_m"],
                         ids=["1.5b", "7b"])
def test_qkv_rope_decode_is_bit_exact(rng, force, layout, n_ctx):
    """The 1.5B and 7B layouts (their q/k/v launches take the pipe kernel: one chunk a lane ahead, and the 7B's
    whole-row build, whose V rows are Q6_K in 14 of its layers) decode to the same logits with the projection
    rotating and storing (every decode step must take the epilogue: cuda.qkv_rope=epilogue) as with the
    separate RoPE + KV store node (=0), graph replays included, and the fused run twice to the same bits: with
    the warp decode attention (a cache of 64) and the tensor-core one (8,448), whose loads started before the
    wait for q and row p once gave eager steps different bits from run to run."""
    model = M.Model(str(layout_model(layout)))
    prompt = rng.integers(0, 151936, size=7).astype(np.int32)
    force("cuda.qkv_rope", "epilogue")
    s = M.Session(model, threads=4, n_ctx=n_ctx, device="cuda")
    assert [n["op"] for n in s.plan(1).nodes].count("FusedQkvRope") == 28
    fused, _ = forward(model, "cuda", prompt, 6, n_ctx=n_ctx)
    again, _ = forward(model, "cuda", prompt, 6, n_ctx=n_ctx)
    force("cuda.qkv_rope", "0")
    s = M.Session(model, threads=4, n_ctx=n_ctx, device="cuda")
    assert "FusedQkvRope" not in [n["op"] for n in s.plan(1).nodes]
    unfused, _ = forward(model, "cuda", prompt, 6, n_ctx=n_ctx)
    assert np.array_equal(fused, again)
    assert np.array_equal(fused, unfused)


def test_norm_pdl_choice(q15, rng, force):
    """When decode's add + norm lets the next kernel launch (cuda.norm_pdl: as it starts, or once its own wait
    is over; before the q/k/v projection, the FFN or both) changes when kernels start, not what they compute: the
    same bits, the 8-bit activations included, for the norm and the projection after it.  (A hand-built graph
    sets the metadata the fusion pass sets on a model's graph: which q weight the norm feeds.)"""
    m, s = q15
    a, b = (rng.standard_normal((2, 1, 1536)) * 3).astype(np.float32)
    outs = {}
    for norm, proj in (("ffn_norm", dict(op="FusedFFN", cols=8960, meta=dict(w_gate="blk.1.ffn_gate.weight",
                                                                             w_up="blk.1.ffn_up.weight"))),
                       ("attn_norm", dict(op="MatMul", cols=1536, meta=dict(weight="blk.1.attn_q.weight")))):
        nodes = [dict(op="AddRmsNorm", inputs=[0, 1], rows=1, cols=2 * 1536,
                      meta=dict(weight=f"blk.1.{norm}.weight", eps=1e-6,
                                **({"feeds_q": "blk.1.attn_q.weight"} if norm == "attn_norm" else {}))),
                 dict(inputs=[(2, 1536, 1536)], rows=1, **proj)]
        for v in ("release", "auto", "wait", "wait-attn", "wait-ffn"):
            force("cuda.norm_pdl", v)
            outs[norm, v] = s.run_ops("cuda", [a, b], nodes)
        for v in ("auto", "wait", "wait-attn", "wait-ffn"):
            for x, y in zip(outs[norm, "release"], outs[norm, v]):
                assert np.array_equal(x, y), (norm, v)


@pytest.mark.parametrize("rows", [1, 3, 7, 9])
def test_add_rmsnorm(q15, rng, rows):
    """The residual add fused with the next norm: the sum window is exactly a + b, the norm window
    within RmsNorm's bound of the reference's norm of that sum.  Decode rows (up to 4) take the float4
    kernel, more rows the scalar one (prefill's)."""
    m, s = q15
    a = (rng.standard_normal((rows, 1536)) * 3).astype(np.float32)
    b = rng.standard_normal((rows, 1536)).astype(np.float32)
    meta = dict(weight="blk.0.ffn_norm.weight", eps=1e-6)
    fused = s.run_ops("cuda", [a, b], [dict(op="AddRmsNorm", inputs=[0, 1], rows=rows, cols=2 * 1536, meta=meta)])[2]
    ref = s.run_ops("reference", [a, b], [dict(op="Add", inputs=[0, 1], rows=rows, cols=1536),
                                         dict(op="RmsNorm", inputs=[2], rows=rows, cols=1536, meta=meta)])
    assert np.array_equal(fused[:, :1536], a + b)
    close(fused[:, 1536:], ref[3], 1e-5)


@pytest.mark.parametrize("rows", [3, 9, 64])
def test_batch_products_take_the_bf16_their_producer_wrote(q15, rng, rows):
    """A batch step's norm (AddRmsNorm) and SwiGLU also write their output in gemm_mma's bf16 layout for the
    product right after them, which then launches no conversion (mma_act) of its own: the q/k/v and gate/up
    products after a norm and the down product after the SwiGLU give the bits they give when each node runs
    alone and converts its input itself."""
    m, s = q15
    a, b = (rng.standard_normal((2, rows, 1536)) * 3).astype(np.float32)
    L = "blk.5."  # its v is Q6_K

    def norm(w, **meta):
        return dict(op="AddRmsNorm", inputs=[0, 1], rows=rows, cols=2 * 1536, meta=dict(weight=L + w, eps=1e-6, **meta))
    qkv = dict(op="FusedQKV", rows=rows, cols=1536 + 512, meta=dict(
        wq=L + "attn_q.weight", wk=L + "attn_k.weight", wv=L + "attn_v.weight", bq=L + "attn_q.bias",
        bk=L + "attn_k.bias", bv=L + "attn_v.bias", q_cols=1536, k_cols=256, v_cols=256))
    ffn = dict(op="FusedFFN", rows=rows, cols=8960, meta=dict(w_gate=L + "ffn_gate.weight", w_up=L + "ffn_up.weight",
                                                            feeds=L + "ffn_down.weight"))
    down = dict(op="MatMul", rows=rows, cols=1536, meta=dict(weight=L + "ffn_down.weight"))

    def mma_acts(run):
        before = M.cuda_launch_counts().get("mma_act", 0)
        out = run()
        return out, M.cuda_launch_counts().get("mma_act", 0) - before

    def chain():
        return (s.run_ops("cuda", [a, b], [norm("attn_norm.weight", feeds_q=L + "attn_q.weight", feeds=L + "attn_q.weight"),
                                           dict(qkv, inputs=[(2, 1536, 1536)])])
                + s.run_ops("cuda", [a, b], [norm("ffn_norm.weight", feeds=L + "ffn_gate.weight"),
                                             dict(ffn, inputs=[(2, 1536, 1536)]), dict(down, inputs=[3])])[2:])
    first = chain()  # (a scratch that grows on the way loses what was written there: that product converts)
    chained, n = mma_acts(chain)
    assert n == 0
    assert all(np.array_equal(x, y) for x, y in zip(first, chained))
    y_attn, y_ffn = chained[2][:, 1536:].copy(), chained[4][:, 1536:].copy()  # [a, b, norm, qkv, norm, ffn, down]
    alone, n = mma_acts(lambda: [s.run_ops("cuda", [y_attn], [dict(qkv, inputs=[0])])[-1],
                                 s.run_ops("cuda", [y_ffn], [dict(ffn, inputs=[0])])[-1],
                                 s.run_ops("cuda", [chained[5]], [dict(down, inputs=[0])])[-1]])
    assert n == 3
    for got, want in zip((chained[3], chained[5], chained[6]), alone):
        assert np.isfinite(want).all() and np.array_equal(got, want)


def test_bad_token_id_is_an_error(q15):
    m, s = q15
    with pytest.raises(minfer.MinferError, match="token id is out of range"):
        s.run_ops("cuda", [np.array([[151936]], np.int32)],
                  [dict(op="GetRows", inputs=[0], rows=1, cols=1536, meta=dict(weight="token_embd.weight"))])
    # the backend stays usable after an input error
    s.run_ops("cuda", [np.array([[5]], np.int32)],
              [dict(op="GetRows", inputs=[0], rows=1, cols=1536, meta=dict(weight="token_embd.weight"))])


# ---- rung 2: whole forward passes ------------------------------------------------------------

@pytest.fixture(scope="module")
def q05_model():
    require_cuda()
    return M.Model(str(layout_model("qwen2.5-coder-0.5b-instruct-q4_k_m")))


def test_forward_matches_cpu_on_the_real_layout(q05_model, rng):
    """qwen2.5-coder-0.5b's layout (Q5_0/Q8_0/Q4_K/Q6_K): 33 prompt tokens (the
    tensor-core path) and 6 decode steps (matvec, graph replay from the second
    step) against the CPU backend.  The two differ by design in how activations
    are rounded before each matmul (CPU: 8-bit blocks, as llama.cpp; GPU: f32 for
    decode, f16 for prefill); the bound is the one the CPU itself meets against
    llama.cpp on the quantized synthetic models (3e-2, test_llamacpp_synthetic),
    relative to the logits' scale here."""
    prompt = rng.integers(0, 151936, size=33).astype(np.int32)
    gpu, sg = forward(q05_model, "cuda", prompt, 6)
    cpu, _ = forward(q05_model, "cpu", prompt, 0)
    assert sg.device == "cuda"
    scale = np.abs(cpu).max()
    d = np.abs(gpu[:33] - cpu).max()
    assert d <= 3e-2 * scale, (d, scale)


@pytest.mark.parametrize("name", ["q05", "qwen3"])
def test_decode_fusions(q05_model, name, rng, force):
    """On CUDA the decode graph fuses q/k/v (with qwen3's norms), gate/up, RoPE + KV store (qwen2: into the
    q/k/v projection) and each residual add with the next norm, and the
    fused forward pass matches the unfused one.  Decode keeps its activations f32 for the comparison: the
    fused norm sums in another order, and an ulp of difference would move an 8-bit activation by a step."""
    force("cuda.decode_activations", "f32")
    # and the prompt's products on f16 slices: the bf16 product's split of K follows its launch's blocks, so q, k
    # and v in one launch sum in another order than each alone (the bf16 layouts the fused producers write are
    # checked bit for bit in test_batch_products_take_the_bf16_their_producer_wrote)
    force("cuda.batch_matmul", "f16")
    model = q05_model if name == "q05" else M.Model(str(synthetic_model("qwen3-tiny-q8_0")))
    s = M.Session(model, threads=4, n_ctx=256, device="cuda")
    ops = [n["op"] for n in s.plan(1).nodes]
    n_layer = ops.count("Attn")
    if name == "qwen3":  # the per-head norms sit between the projection and the rotation
        assert ops.count("FusedQkvNorm") == n_layer and ops.count("RopeKvStore") == n_layer
    else:  # the projection rotates and stores itself (FusedQkvRope)
        assert ops.count("FusedQkvRope") == n_layer and "RopeKvStore" not in ops and "FusedQKV" not in ops
    assert ops.count("FusedFFN") == n_layer
    assert "KvStore" not in ops and "Rope" not in ops and "QkNorm" not in ops and "Add" not in ops
    assert ops.count("AddRmsNorm") == 2 * n_layer and ops.count("RmsNorm") == 1  # the first attn_norm
    # the fusion pass tells each add + norm before a layer's q/k/v projection which q weight it feeds
    feeds = [n.get("feeds_q") for n in s.plan(1).nodes if n["op"] == "AddRmsNorm"]
    assert [f for f in feeds if f] == [f"blk.{i}.attn_q.weight" for i in range(1, n_layer)], feeds
    prompt = rng.integers(0, 151936, size=5).astype(np.int32)
    fused, _ = forward(model, "cuda", prompt, 4)
    unfused, _ = forward(model, "cuda", prompt, 4, fuse=False)
    close(fused, unfused, 1e-5)


@pytest.mark.parametrize("n", [1000, 4096, 4097, 151936, 152064])
def test_device_argmax(n, rng):
    """Greedy decoding's device argmax (blocks of 4096 values, then one block over their winners) against
    numpy's at real vocabulary sizes, with the maximum in the first, a middle and the last block, ties across
    blocks (the first index wins), all -inf (token 0, as a scan), a NaN (flagged, never the winner), and runs
    back to back (each reuses the scratch of the one before)."""
    x = rng.standard_normal(n).astype(np.float32)
    for where in sorted({0, 4095 % n, min(4096, n - 1), n // 2, n - 1}):
        y = x.copy()
        y[where] = 10.0
        assert M.cuda_argmax(y, 5) == ([where] * 5, False)
    y = x.copy()
    y[[n // 3, n - 1]] = 10.0  # in different blocks where n > 4096
    assert M.cuda_argmax(y, 3) == ([n // 3] * 3, False)
    assert M.cuda_argmax(np.full(n, -np.inf, np.float32), 2) == ([0, 0], False)
    y = x.copy()
    y[n - 2] = np.nan
    assert M.cuda_argmax(y, 2) == ([int(np.nanargmax(y))] * 2, True)
    with pytest.raises(minfer.MinferError, match="cuda_argmax: 1 rows of 0 values"):
        M.cuda_argmax(np.zeros(0, np.float32))


def first_best(x, allow=None):
    """numpy's argmax of each row among the allowed (bit i of allow[r, i // 32]), NaN never winning: the first
    index of the row's largest value, 0 where nothing is finite or allowed (as a scan from -inf picks)."""
    y = np.where(np.isnan(x), -np.inf, x)
    if allow is not None:
        bits = np.unpackbits(allow.view(np.uint8), axis=1, bitorder="little")[:, :x.shape[1]].astype(bool)
        y = np.where(bits, y, -np.inf)
    return [int(np.argmax(r)) for r in y]


@pytest.mark.parametrize("n", [1000, 4097, 152064])
@pytest.mark.parametrize("rows", [3, 64])
def test_device_argmax_rows(n, rows, rng):
    """A batch step's argmax: every row in one launch pair (at 152064 values 26 rows fit the scratch: 64 rows are
    three launches), each row's winner placed apart, ties across blocks, a row all -inf, NaN rows (flagged, never
    chosen), and with masks (a batch of constrained rows: the winner among the allowed, a row with none allowed)
    against numpy, twice back to back."""
    x = rng.standard_normal((rows, n)).astype(np.float32)
    for r in range(rows):
        x[r, (r * 7919) % n] = 10.0 + r % 3  # winners in every block position across the rows
    x[1, [n // 3, n - 1]] = 20.0  # a tie across blocks: the first wins
    x[rows - 1] = -np.inf
    assert M.cuda_argmax(x, 2) == (first_best(x) * 2, False)
    y = x.copy()
    y[0, 5] = np.nan
    y[2, n - 1] = np.nan
    assert M.cuda_argmax(y, 1) == (first_best(y), True)
    words = (n + 31) // 32
    allow = rng.integers(0, 2**32, size=(rows, words), dtype=np.uint64).astype(np.uint32)
    allow[0] = 0  # nothing allowed: token 0
    allow[1, :] = 0
    allow[1, (n // 2) // 32] = 1 << ((n // 2) % 32)  # only one token allowed
    got = M.cuda_argmax(x, 2, allow)
    assert got == (first_best(x, allow) * 2, False)
    assert got[0][1] == n // 2
    with pytest.raises(ValueError, match="allow must be"):
        M.cuda_argmax(x, 1, allow[:, :-1])


def test_greedy_on_device_matches_host_argmax(q05_model, rng):
    s = M.Session(q05_model, threads=4, n_ctx=64, device="cuda")
    prompt = rng.integers(0, 151936, size=7).astype(np.int32)
    for start, toks in ((0, prompt), (7, prompt[:1]), (8, prompt[:1])):
        logits = s.eval(toks, start)
        assert s.eval_greedy(toks, start) == int(np.argmax(logits[-1]))


def test_greedy_chain_on_device(q05_model, rng):
    """decode_greedy on CUDA runs its steps as a device chain (the argmax writes the next step's token and
    advances the position; chained_steps counts them) and picks what eval_greedy in a loop picks, across
    the chain's wait every 256 steps; the session's steps from host inputs go on after it."""
    s = M.Session(q05_model, threads=4, n_ctx=320, device="cuda")
    prompt = rng.integers(0, 151936, size=7).astype(np.int32)
    first = s.eval_greedy(prompt, 0)
    chained = s.decode_greedy(first, 7, 300)
    assert s.chained_steps == 300
    tok, loop = first, []
    for i in range(300):
        tok = s.eval_greedy(np.array([tok], np.int32), 7 + i)
        loop.append(tok)
    assert chained.tolist() == loop
    assert s.decode_greedy(int(chained[9]), 17, 3).tolist() == loop[10:13]  # a chain from the middle
    assert s.chained_steps == 303
    with pytest.raises(minfer.MinferError, match="exceed the context"):
        s.decode_greedy(first, 300, 21)


def test_greedy_chain_on_a_short_step():
    """The device chain on the tiny layout, whose steps are a few microseconds: its tokens are eval_greedy's
    in a loop.  Each step's first kernel waits for the previous step's argmax before it lets the next kernels
    start; releasing first, they read the position before the argmax had advanced it (wrong from step 3)."""
    path = str(synthetic_model("qwen2-tiny-q8_0"))
    prompt = np.array([9707, 1879, 11, 419, 374], np.int32)
    s = M.Session(M.Model(path), threads=2, n_ctx=256, device="cuda")
    first = s.eval_greedy(prompt, 0)
    chained = s.decode_greedy(first, len(prompt), 60).tolist()
    tok, loop = first, []
    for i in range(60):
        tok = s.eval_greedy(np.array([tok], np.int32), len(prompt) + i)
        loop.append(tok)
    assert chained == loop


def test_llm_greedy_takes_the_device_chain(monkeypatch):
    """minfer.LLM's greedy generation on CUDA takes its tokens from decode_greedy (chained_steps grows) and
    gives the tokens of the path that reads each step's logits back and samples them on the host."""
    llm = minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), n_ctx=256, backend="cuda")
    ids = llm.tokenize("Hello world, this is")
    assert llm._session.chains
    before = llm._session.chained_steps
    chained = llm.generate(ids, max_tokens=40)
    assert llm._session.chained_steps > before
    monkeypatch.setattr(minfer.llm, "GREEDY_CHUNK", 0)
    # a second LLM, so that its prompt is prefilled too (the first one's cache would have its last prompt token
    # evaluated as a decode step: other arithmetic for the first token's logits)
    host = minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), n_ctx=256, backend="cuda").generate(ids, max_tokens=40)
    assert chained.tokens == host.tokens and chained.text == host.text and len(host.tokens) > 1


def test_speculative_on_the_device():
    """A draft model (and prompt lookup) on CUDA, both models on the device: every greedy token is the argmax of
    the target's logits for its prefix (LLM.logits: one prefill, other arithmetic) up to rounding -- the tiny
    random model's top logits lie within hundredths of each other, a token of a wrong row ~0.9 below --, sampled
    tokens (top-k 4) are among the 4 likeliest, drafts are kept and rejected, and the tokens between drafts
    come from the device's chained steps."""
    from minfer.speculative import MAX_DRAFT, DraftLength

    llm = minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), n_ctx=256, backend="cuda",
                     draft_model=str(synthetic_model("qwen2-tiny-q4_0")), draft_p_min=0.0)
    llm._lookup_policy = DraftLength(MAX_DRAFT, timed=False)
    llm._draft.policy = DraftLength(MAX_DRAFT, timed=False)
    before = llm._session.chained_steps
    drafted = accepted = 0
    for i, prompt in enumerate(["def add(a, b):\n    return a + b\n", "one two three one two three", "x = [1, 2,"]):
        ids = llm.tokenize(prompt)
        for kw in (dict(), dict(lookup=True), dict(temperature=0.8, top_k=4, seed=i)):
            out = llm.generate(ids, max_tokens=40, **kw)
            drafted += out.metrics.drafted_tokens
            accepted += out.metrics.accepted_tokens
            rows = llm.logits(ids + out.tokens[:-1])[len(ids) - 1:]
            for row, t in zip(rows, out.tokens):
                if kw.get("temperature"):
                    assert row[t] >= np.sort(row)[-4] - 0.02, (prompt, kw)
                else:
                    assert row[t] >= row.max() - 0.02, (prompt, kw, row.max() - row[t])
    assert drafted > accepted > 0 and llm._session.chained_steps > before
    llm.close()


def test_greedy_on_nan_logits_is_an_error(tmp_path):
    """The device argmax flags NaN logits: eval_greedy and the device chain raise instead of returning token 0."""
    s = M.Session(M.Model(str(nan_logits_model(tmp_path))), threads=2, n_ctx=320, device="cuda")
    for _ in range(2):  # the second step replays the captured graph
        with pytest.raises(minfer.MinferError, match="logit is NaN"):
            s.eval_greedy(np.array([3], np.int32), 5)
    with pytest.raises(minfer.MinferError, match="logit is NaN"):
        s.decode_greedy(3, 5, 4)
    with pytest.raises(minfer.MinferError, match="logit is NaN"):  # raised at the chain's first wait
        s.decode_greedy(3, 6, 300)


def test_graph_replay_is_exact(q05_model, rng, setting):
    """Replayed decode steps compute exactly what launching each kernel computes."""
    prompt = rng.integers(0, 151936, size=9).astype(np.int32)
    with_graphs, _ = forward(q05_model, "cuda", prompt, 12)
    setting("MINFER_CUDA_GRAPHS", "0")
    without, _ = forward(q05_model, "cuda", prompt, 12)
    assert np.array_equal(with_graphs, without)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_long_cache_short_context(q05_model, rng, kv_type):
    """Decode attention has a split per 128 positions of the whole cache; the splits past the position hold
    nothing and are never merged.  A 9-token prompt and 12 steps in a cache of 8192 positions (64 splits,
    63 of them empty) give the logits of a 256-position cache (2 splits) bit for bit, with the f16 cache's
    kernel and with the general one (q8_0 cache)."""
    prompt = rng.integers(0, 151936, size=9).astype(np.int32)
    short, _ = forward(q05_model, "cuda", prompt, 12, kv_type=kv_type)
    long, _ = forward(q05_model, "cuda", prompt, 12, n_ctx=8192, kv_type=kv_type)
    assert np.array_equal(short, long)


def test_mixed_graph_splits(q05_model, rng, force, setting):
    """Ops forced to the CPU (MINFER_CPU_OPS): the plan alternates devices and
    copies across at each split, and the logits still match the all-GPU run
    (the moved ops are exact elementwise ops and rope, so only f32 rounding differs).  Decode keeps its
    activations f32 here: rounding them to 8 bits would turn an ulp of difference in x into a step of
    d / 127 in a matvec input, which is what the activation rounding costs, not what splits do."""
    force("cuda.decode_activations", "f32")
    prompt = rng.integers(0, 151936, size=12).astype(np.int32)
    ref, _ = forward(q05_model, "cuda", prompt, 4)
    setting("MINFER_CPU_OPS", "Rope,Add")
    mixed, s = forward(q05_model, "cuda", prompt, 4)
    splits = s.plan(1).splits
    backends = {sp["backend"] for sp in splits}
    assert backends == {0, 1} and len(splits) > 50, splits[:4]
    scale = np.abs(ref).max()
    assert np.abs(mixed - ref).max() <= 1e-3 * scale


def test_unknown_cpu_op_is_an_error(setting):
    with pytest.raises(minfer.MinferError, match="MINFER_CPU_OPS='Rop': unknown op 'Rop'"):
        setting("MINFER_CPU_OPS", "Rop")


def test_wait_is_bounded(q05_model, setting):
    """A wait that outlasts MINFER_GPU_TIMEOUT_S is an exception (here the wait
    for the 0.5 GB weight upload, which cannot finish within a microsecond)."""
    setting("MINFER_GPU_TIMEOUT_S", "0.000001")
    with pytest.raises(minfer.MinferError, match="did not finish within 0.0 s"):
        M.Session(q05_model, device="cuda")


def test_kernel_entry_points_wait_bounded(rng, setting):
    """cuda_matmul and cuda_copy_bandwidth (the kernel-level entry points the tests and benchmarks use) wait with
    the backend's bound too: a GEMM of 256 rows over 4096 x 4096 weights, or 20 copies of 256 MB, cannot finish
    within a microsecond, so the wait is an exception naming the bound -- and the GPU, which was never hung, then
    runs the same call to the end (the timed-out call's memory is left allocated, not freed under a kernel)."""
    t, w = random_weight("q4_k", 4096, 4096, rng)
    x = rng.standard_normal((256, 4096)).astype(np.float32)
    setting("MINFER_GPU_TIMEOUT_S", "0.000001")
    with pytest.raises(minfer.MinferError, match=r"running the matmul: the GPU did not finish within 1e-06 s"):
        M.cuda_matmul(t, w, x, 4096, path="gemm")
    with pytest.raises(minfer.MinferError, match=r"the GPU did not finish within 1e-06 s \(MINFER_GPU_TIMEOUT_S\)"):
        M.cuda_copy_bandwidth(1 << 28, 20)
    setting("MINFER_GPU_TIMEOUT_S", "")
    y, _ = M.cuda_matmul(t, w, x[:2], 4096, path="q8")
    assert y.shape == (2, 4096) and np.all(np.isfinite(y))
    assert M.cuda_copy_bandwidth(1 << 26, 4) > 1e11


def test_constrained_generation_on_the_device(q05_model):
    """JSON-schema output on CUDA (the 0.5B layout, random weights: it would emit anything): one sequence (greedy:
    the device's argmax among the allowed, the mask computed while the step runs; sampled: the host sampler) and
    the batch engine with a plain request beside; every output validates, and each greedy token is the best the
    grammar allows in the device's own logits for the whole output (within the prefill/decode rounding)."""
    import json

    jsonschema = pytest.importorskip("jsonschema")
    llg = pytest.importorskip("llguidance")
    from minfer import constrain
    from minfer.batch import Engine
    from minfer.llm import LLM

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["name", "tags", "n"], "additionalProperties": False}
    path = str(layout_model("qwen2.5-coder-0.5b-instruct-q4_k_m"))
    with LLM(path, backend="cuda") as llm:
        prompt = llm.tokenize("Hello")
        out = llm.generate(prompt, max_tokens=80, json_schema=schema)
        assert out.metrics.stop_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
        sampled = llm.generate(prompt, max_tokens=80, json_schema=schema, temperature=1.0, seed=2)
        jsonschema.validate(json.loads(sampled.text), schema)
        logits = llm.logits(prompt + out.tokens)
        m = llg.LLMatcher(constrain.vocabulary(llm.tokenizer, llm.n_vocab),
                          constrain.compile_constraint("json_schema", schema).grammar)
        for i, tok in enumerate(out.tokens):
            row = logits[len(prompt) - 1 + i]
            ok = np.flatnonzero(np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")
                                [:llm.n_vocab])
            assert tok in ok and row[tok] >= row[ok].max() - 3e-2 * np.abs(row).max()
            assert m.consume_token(tok)
    with Engine(path, backend="cuda", max_sequences=4) as eng:
        hs = [eng.submit(prompt, max_tokens=80, json_schema=schema), eng.submit(prompt, max_tokens=16),
              eng.submit(prompt, max_tokens=80, json_schema=schema, temperature=1.0, seed=5)]
        outs = [h.result() for h in hs]
        for o in (outs[0], outs[2]):
            jsonschema.validate(json.loads(o.text), schema)
        assert outs[1].metrics.generated_tokens == 16
