"""The CUDA backend's correctness ladder (issue 6).  Every test here needs an
NVIDIA GPU and skips, saying why, where there is none (CI).

Rung 1: each op against the reference backend (float64) through the real
scheduler (the matmul kernels against float64: test_cuda_matvec.py; the
attention kernels: test_cuda_attention.py).  Rung 2/3: whole forward passes
against the CPU backend and llama.cpp's logits, and the things only a GPU has
(graph replay, bounded waits, mixed CPU/GPU graphs): test_cuda_forward.py
(tests/test_llamacpp_synthetic.py runs its cases on CUDA too; compute-sanitizer:
test_cuda_sanitizer.py).

Layout models (real types and shapes, random weights) come from the headers in
../shared/fixtures/layouts; see conftest.layout_model."""
import numpy as np
import pytest

import minfer
from backend_compare import ELEMENTWISE, check_elementwise, check_rope, close, run_both
from conftest import layout_model, require_cuda, synthetic_model
from cuda_cases import M, U, forward, fused_decode_nodes, q15, _gpu  # noqa: F401 (fixtures)

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
