"""The CUDA attention kernels against float64: the KV store and attention at every KV type, the tensor-core
prefill and decode kernels at long contexts, and the decode kernels a choice forces (the warp kernels with
their cluster merge or combine, the general kernel).  Needs an NVIDIA GPU and skips, saying why, elsewhere.

The tensor-core kernels round q and the probabilities to f16 (attention_ref.f16_attention_bound bounds what
that moves); keys scaled so each row's weight sits on a few positions make a mis-masked tile, a mis-paired
fragment or a dropped split move some output by O(1), far past that bound."""
import numpy as np
import pytest

from attention_ref import causal_attention_f64, f16_attention_bound
from backend_compare import close, run_both
from cuda_cases import q15, _gpu  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu


def check_f16(out, ref, q, k, v, n_head, n_head_kv, head_dim):
    """Within the f16 rounding bound everywhere, and on average far inside it (float64 with the kernels'
    rounding errs by about a tenth of 0.005 of the output's scale; one dropped key tile by several times it)."""
    k16, v16 = (np.asarray(x, np.float16).astype(np.float64) for x in (k, v))
    err = np.abs(out - ref)
    assert err.max() <= f16_attention_bound(q, k16, v16, n_head, n_head_kv, head_dim), err.max()
    assert err.mean() <= 0.005 * np.abs(ref).mean(), (err.mean(), np.abs(ref).mean())


@pytest.mark.parametrize("rows,first", [(1, 700), (3, 40), (300, 200)], ids=["decode-split", "decode3", "prefill"])
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0"])
@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(12, 2, 128), (14, 2, 64)])
def test_kvstore_attention(q15, rng, kv_type, n_head, n_head_kv, head_dim, rows, first):
    """KvStore then Attn against the reference backend.  Over f16 300 rows take the tensor-core prefill (the
    f16 bound) and one row the warp decode kernels (a cache of 1,024); three rows and the other types the
    general kernel."""
    m, s = q15
    n_ctx = 1024  # 4 chunks of 256: decode at 700 spans 3 splits, prefill rows cross a chunk edge
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((rows, n_head_kv * head_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((rows, n_head_kv * head_dim)).astype(np.float32)
    pos = (np.arange(rows) + first).astype(np.int32).reshape(rows, 1)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type=kv_type, n_ctx=n_ctx,
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=rows, cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 3, 4], rows=rows, cols=n_head * head_dim, meta=meta)]
    gpu, ref = run_both(s, [q, k, v, pos], nodes, "cuda")  # cells before `first` are zero-filled and attended to
    if kv_type == "f16" and rows == 300:
        check_f16(gpu, ref, q, k, v, n_head, n_head_kv, head_dim)
    else:
        close(gpu, ref, 1e-5)


@pytest.mark.parametrize("length,head_dim", [(4096, 128), (16384, 64), (32768, 128)])
def test_long_prefill_attention(q15, rng, length, head_dim):
    """Tensor-core prefill over a long f16 cache (8 query heads over 2 KV heads) against float64: 128 rows at
    the end of the context (a prompt's last tile: unmasked key tiles, then the diagonal) and 128 rows at random
    positions across it (every key tile masked for some row)."""
    m, s = q15
    n_head, n_head_kv = 8, 2
    k = (rng.standard_normal((length, n_head_kv * head_dim)) * 6).astype(np.float32)
    v = rng.standard_normal((length, n_head_kv * head_dim)).astype(np.float32)
    pos = np.concatenate([np.arange(length - 128, length), np.sort(rng.choice(length - 128, 128, replace=False))])
    q = rng.standard_normal((len(pos), n_head * head_dim)).astype(np.float32)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type="f16", n_ctx=length,
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0)
    all_pos = np.arange(length, dtype=np.int32).reshape(-1, 1)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=length, cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 4, 5], rows=len(pos), cols=n_head * head_dim, meta=meta)]
    gpu = s.run_ops("cuda", [q, k, v, all_pos, pos.astype(np.int32).reshape(-1, 1)], nodes)[-1]
    k16, v16 = (x.astype(np.float16).astype(np.float64) for x in (k, v))
    ref = causal_attention_f64(q, k16, v16, pos, n_head, n_head_kv, head_dim)
    check_f16(gpu, ref, q, k, v, n_head, n_head_kv, head_dim)


@pytest.mark.parametrize("length,n_head,n_head_kv,head_dim", [(4096, 28, 4, 128), (16384, 14, 2, 64),
                                                              (32768, 28, 4, 128), (4096, 16, 2, 128),
                                                              (4096, 4, 2, 64)])
def test_long_decode_attention(q15, rng, force, length, n_head, n_head_kv, head_dim):
    """Decode on the tensor cores (a KV head's 2-8 query heads attended in one block; the rule for caches of
    more than 8,192 positions) over a long f16 cache against float64, in the 7B's, the 0.5B's and eight- and
    two-head groups: the last position, one 45 into a chunk (its last two warps see nothing) and one in the
    first chunk.  The warp kernels (forced) match float64 to f32 rounding; the two differ."""
    m, s = q15
    k = (rng.standard_normal((length, n_head_kv * head_dim)) * 6).astype(np.float32)
    v = rng.standard_normal((length, n_head_kv * head_dim)).astype(np.float32)
    pos = [length - 1, length // 2 + 45, 100]
    q = rng.standard_normal((len(pos), n_head * head_dim)).astype(np.float32)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type="f16", n_ctx=max(length, 8448),
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0)
    inputs = [k, v, np.arange(length, dtype=np.int32).reshape(-1, 1)]
    for i, p in enumerate(pos):
        inputs += [q[i:i + 1], np.array([[p]], np.int32)]
    store = len(inputs)  # the KvStore node's index
    nodes = [dict(op="KvStore", inputs=[0, 1, 2], rows=length, cols=1, meta=meta)]
    nodes += [dict(op="Attn", inputs=[3 + 2 * i, 4 + 2 * i, store], rows=1, cols=n_head * head_dim, meta=meta)
              for i in range(len(pos))]
    k16, v16 = (x.astype(np.float16).astype(np.float64) for x in (k, v))
    ref = causal_attention_f64(q, k16, v16, pos, n_head, n_head_kv, head_dim)
    tc = np.concatenate(s.run_ops("cuda", inputs, nodes)[store + 1:])
    check_f16(tc, ref, q, k, v, n_head, n_head_kv, head_dim)
    force("cuda.attention", "warp")
    warp = np.concatenate(s.run_ops("cuda", inputs, nodes)[store + 1:])
    close(warp, ref, 1e-5)
    assert not np.array_equal(tc, warp)


def decode_attention_case(rng, head_dim, first, n_ctx, attentions, n_head=12, n_head_kv=2):
    """12 query heads over 2 KV heads (or as given): the f16 cache filled with positions 0..first (a multi-row
    store), then `attentions` one-row attentions at the last position."""
    q = rng.standard_normal((1, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((first + 1, n_head_kv * head_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((first + 1, n_head_kv * head_dim)).astype(np.float32)
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type="f16", n_ctx=n_ctx,
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0)
    pos_all = np.arange(first + 1, dtype=np.int32).reshape(-1, 1)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=first + 1, cols=1, meta=meta)]
    nodes += [dict(op="Attn", inputs=[0, 4, 5], rows=1, cols=n_head * head_dim, meta=meta)] * attentions
    return [q, k, v, pos_all, pos_all[-1:]], nodes


@pytest.mark.parametrize("head_dim,first", [(128, 700), (64, 700), (64, 90), (128, 6200)])
def test_decode_attention_kernels_agree(q15, rng, force, head_dim, first):
    """Decode over an f16 cache of more than 8,192 positions with six query heads a KV head takes the
    tensor-core group kernel (within the f16 bound of the reference); cuda.attention=warp the warp-split
    kernels (a block per query head) and =general the general one (f32 sums in different orders: 1e-5).  At
    6200 the combine merges 49 splits (more than its first warp has lanes).  The three differ."""
    m, s = q15
    inputs, nodes = decode_attention_case(rng, head_dim, first, 8448, attentions=1)
    ref = s.run_ops("reference", inputs, nodes)[-1]
    out = {}
    for kernel in ("auto", "warp", "general"):
        force("cuda.attention", kernel)
        out[kernel] = s.run_ops("cuda", inputs, nodes)[-1]
    check_f16(out["auto"], ref, *inputs[:3], 12, 2, head_dim)
    close(out["warp"], ref, 1e-5)
    close(out["general"], ref, 1e-5)
    assert not np.array_equal(out["auto"], out["warp"]) and not np.array_equal(out["warp"], out["general"])


@pytest.mark.parametrize("head_dim,first,n_ctx", [(128, 90, 1024), (64, 700, 1024), (128, 200, 256), (128, 1100, 1300),
                                                  (64, 1100, 1300), (128, 6200, 6400)])
def test_decode_attention_cluster_merge(q15, rng, force, head_dim, first, n_ctx):
    """The warp kernels' splits (forced: cuda.attention=warp) merged inside the attention kernel by one
    cluster of up to 8 blocks a head (distributed shared memory) match the reference, as the combine launch
    does: blocks with no chunk (90 and 700 positions in 1024), a cluster of 2 (n_ctx 256), and blocks that
    walk 2 and 7 chunks (1100 positions in 1300, 6200 in 6400; the choice forces the cluster merge, which the
    rule gives only 8-split caches at 12 heads).  Two attentions in a row give the same bits."""
    m, s = q15
    force("cuda.attention", "warp")
    inputs, nodes = decode_attention_case(rng, head_dim, first, n_ctx, attentions=2)
    ref = s.run_ops("reference", inputs, nodes[:2])[-1]
    out = s.run_ops("cuda", inputs, nodes)
    assert np.array_equal(out[-1], out[-2])
    close(out[-1], ref, 1e-5)
    for merge in ("cluster", "combine"):  # forced either way (auto keeps 12 heads of more than 8 splits on the combine)
        force("cuda.attention_merge", merge)
        out = s.run_ops("cuda", inputs, nodes)
        assert np.array_equal(out[-1], out[-2])
        close(out[-1], ref, 1e-5)
