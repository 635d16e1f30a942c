"""The CPU attention's two kernels -- f32 in portable loops a (row, head) at a time, and f32 on register tiles
(cpu.attention=f32|tiles; the rule takes tiles on the avx2, avx512 and neon tiers) -- against
float64 at long context, and the invariants prefix reuse and preemption rest on: a row's result does not
depend on the rows beside it (a decode row alone gives the bits it has inside a prompt) nor on how the work
is cut into tasks."""
import numpy as np
import pytest

import minfer
from attention_ref import causal_attention_f64
from backend_compare import close
from conftest import real_model
from minfer.quants import GGMLType, available_isas, dequantize, quantize


@pytest.fixture(scope="module")
def model():
    return minfer._minfer.Model(str(real_model("qwen2.5-coder-1.5b")))


def quantize_roundtrip_q8_0(x):
    """What a q8_0 cache holds of rows x, in float64."""
    return np.stack([dequantize(quantize(row, GGMLType.Q8_0), GGMLType.Q8_0) for row in x]).astype(np.float64)


def has_tiles():
    return minfer._minfer.cpu_attention_kernel("f16", 128) == "tiles"


@pytest.fixture(params=["f32", "tiles"])
def kernel(request, force):
    if request.param == "tiles" and not has_tiles():
        pytest.skip("this CPU (or the session's ISA tier) has no tiles (AVX2, AVX-512 or NEON)")
    force("cpu.attention", request.param)
    return request.param


def attention(session, q, k, v, pos, n_head, n_head_kv, head_dim, window=0, kv_type="f16"):
    """Keys/values of positions 0..len(k)-1 stored, then one Attn over the query rows at `pos`."""
    meta = dict(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, kv_type=kv_type, n_ctx=len(k),
                attn_scale=float(1 / np.sqrt(head_dim)), layer=0, window=window)
    nodes = [dict(op="KvStore", inputs=[1, 2, 3], rows=len(k), cols=1, meta=meta),
             dict(op="Attn", inputs=[0, 4, 5], rows=len(pos), cols=n_head * head_dim, meta=meta)]
    all_pos = np.arange(len(k), dtype=np.int32).reshape(-1, 1)
    return session.run_ops("cpu", [q, k, v, all_pos, np.asarray(pos, np.int32).reshape(-1, 1)], nodes, poison=True)[-1]


def windowed_f64(q, k, v, pos, n_head, n_head_kv, head_dim, window):
    out = np.zeros((len(pos), n_head * head_dim))
    g = n_head // n_head_kv
    for r, p in enumerate(pos):
        lo = max(0, p - window + 1) if window else 0
        for h in range(n_head):
            kh = slice(h // g * head_dim, (h // g + 1) * head_dim)
            s = k[lo:p + 1, kh] @ q[r, h * head_dim:(h + 1) * head_dim].astype(np.float64) / np.sqrt(head_dim)
            w = np.exp(s - s.max())
            out[r, h * head_dim:(h + 1) * head_dim] = (w / w.sum()) @ v[lo:p + 1, kh]
    return out


@pytest.mark.parametrize("n_head,n_head_kv,head_dim,n_ctx,window", [
    (12, 2, 128, 8192, 0),   # the 1.5B at 8k
    (14, 2, 64, 4096, 0),    # the 0.5B's heads of 64
    (4, 1, 256, 1024, 300),  # gemma 3's local layers: heads of 256, a window
])
def test_kernels_against_float64(model, rng, kernel, n_head, n_head_kv, head_dim, n_ctx, window):
    """Decode rows at random depths and a prompt block at the end of a full f16 cache, against float64 over
    the stored (f16-rounded) keys and values.  Keys are scaled so each row's weight sits on few positions."""
    s = minfer._minfer.Session(model, threads=2)
    dim = n_head_kv * head_dim
    k = (rng.standard_normal((n_ctx, dim)) * 4).astype(np.float32)
    v = rng.standard_normal((n_ctx, dim)).astype(np.float32)
    pos = np.concatenate([np.sort(rng.choice(n_ctx - 21, 6, replace=False)), np.arange(n_ctx - 21, n_ctx)])
    q = rng.standard_normal((len(pos), n_head * head_dim)).astype(np.float32)
    out = attention(s, q, k, v, pos, n_head, n_head_kv, head_dim, window)
    kd, vd = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
    if window:
        ref = windowed_f64(q, kd, vd, pos, n_head, n_head_kv, head_dim, window)
    else:
        ref = causal_attention_f64(q, kd, vd, pos, n_head, n_head_kv, head_dim)
    close(out, ref, 1e-5)


@pytest.mark.parametrize("window", [0, 45])
def test_row_alone_equals_row_in_a_prompt(model, rng, kernel, window):
    """A prompt of 37 rows (positions 190..226, keys in several 32- and 64-key chunks) against each of
    three of its rows run alone, as decode runs it: the same bits."""
    s = minfer._minfer.Session(model, threads=2)
    n_head, n_head_kv, head_dim, n = 12, 2, 128, 256
    k = (rng.standard_normal((n, n_head_kv * head_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((n, n_head_kv * head_dim)).astype(np.float32)
    pos = np.arange(190, 227)
    q = rng.standard_normal((len(pos), n_head * head_dim)).astype(np.float32)
    block = attention(s, q, k, v, pos, n_head, n_head_kv, head_dim, window)
    assert np.isfinite(block).all()
    for r in (0, 17, 36):
        alone = attention(s, q[r:r + 1], k, v, pos[r:r + 1], n_head, n_head_kv, head_dim, window)
        assert np.array_equal(alone[0], block[r]), r


@pytest.mark.parametrize("n", [1, 20], ids=["decode", "prefill"])
def test_attention_does_not_depend_on_how_tasks_are_cut(model, rng, kernel, n):
    """With fewer (kv head, row block) tasks than threads, a task takes part of a KV head's query heads
    (here 8 threads, 2 KV heads, 1 or 2 row blocks: parts of each group of 6); with one thread, one task
    per KV head and row block.  Each (row, head) runs the same arithmetic either way: the same bits (and
    every output is written: the buffers start poisoned)."""
    n_head, n_head_kv, head_dim, n_ctx = 12, 2, 128, 256
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((n_ctx, n_head_kv * head_dim)) * 2).astype(np.float32)
    v = rng.standard_normal((n_ctx, n_head_kv * head_dim)).astype(np.float32)
    pos = np.arange(n) + 150  # keys across several chunks
    outs = [attention(minfer._minfer.Session(model, threads=t), q, k, v, pos, n_head, n_head_kv, head_dim)
            for t in (1, 8)]
    assert np.isfinite(outs[0]).all()
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("kv_type,head_dim", [("q8_0", 96), ("f32", 80)])
def test_tiles_against_float64_on_other_caches(model, rng, force, kv_type, head_dim):
    """The register tiles read every cache type (q8_0 and f32 rows through the f32 conversion) and heads that
    are not a multiple of 64 (96, 80): against float64 over the stored values (q8_0: what the cache holds, its
    blocks quantized and dequantized by the reference)."""
    if not has_tiles():
        pytest.skip("this CPU (or the session's ISA tier) has no tiles (AVX2, AVX-512 or NEON)")
    s = minfer._minfer.Session(model, threads=2)
    n_head, n_head_kv, n_ctx = 10, 2, 700
    k = (rng.standard_normal((n_ctx, n_head_kv * head_dim)) * 3).astype(np.float32)
    v = rng.standard_normal((n_ctx, n_head_kv * head_dim)).astype(np.float32)
    pos = np.concatenate([[3, 64, 333], np.arange(n_ctx - 9, n_ctx)])
    q = rng.standard_normal((len(pos), n_head * head_dim)).astype(np.float32)
    force("cpu.attention", "tiles")
    out = attention(s, q, k, v, pos, n_head, n_head_kv, head_dim, kv_type=kv_type)
    if kv_type == "q8_0":
        kd, vd = quantize_roundtrip_q8_0(k), quantize_roundtrip_q8_0(v)
    else:
        kd, vd = k.astype(np.float64), v.astype(np.float64)
    close(out, causal_attention_f64(q, kd, vd, pos, n_head, n_head_kv, head_dim), 1e-5)


def test_tiles_differ_from_f32(model, rng, force):
    """The forced tiles kernel is not the f32 one under another name: its sums run in another order."""
    if not has_tiles():
        pytest.skip("this CPU (or the session's ISA tier) has no tiles (AVX2, AVX-512 or NEON)")
    s = minfer._minfer.Session(model, threads=2)
    k = rng.standard_normal((512, 256)).astype(np.float32)
    v = rng.standard_normal((512, 256)).astype(np.float32)
    q = rng.standard_normal((4, 1536)).astype(np.float32)
    outs = []
    for kern in ("f32", "tiles"):
        force("cpu.attention", kern)
        outs.append(attention(s, q, k, v, [100, 300, 400, 511], 12, 2, 128))
    assert not np.array_equal(outs[0], outs[1])
    close(outs[1], outs[0], 1e-5)


@pytest.mark.parametrize("head_dim", [66, 272])
def test_tiles_refuse_what_they_lack(model, rng, force, head_dim):
    """Forced onto heads that are not a multiple of the vector width (66: of no width) or wider than 256, the
    tiles are an error naming why, never a silent f32 run; the rule gives such heads the f32 kernel."""
    if not has_tiles():
        pytest.skip("this CPU (or the session's ISA tier) has no tiles (AVX2, AVX-512 or NEON)")
    assert minfer._minfer.cpu_attention_kernel("f16", head_dim) == "f32"
    s = minfer._minfer.Session(model, threads=2)
    k = rng.standard_normal((64, head_dim)).astype(np.float32)
    q = rng.standard_normal((1, 2 * head_dim)).astype(np.float32)
    force("cpu.attention", "tiles")
    with pytest.raises(Exception, match="cpu.attention=tiles cannot run here"):
        attention(s, q, k, k, [63], 2, 1, head_dim, kv_type="f32")


def test_the_tiles_give_the_same_bits_at_every_width(model, rng, force):
    """An avx2 session takes 8-lane tiles, an avx512 one 16-lane tiles: each score and each output is the same
    chain of multiply-adds either way, so the bits agree (and differ from the f32 kernel's); a scalar session
    keeps the f32 kernel, and forcing tiles there is an error."""
    if minfer._minfer.cpu_attention_kernel("f16", 128) != "tiles":
        pytest.skip("this CPU has no AVX2")
    k = rng.standard_normal((300, 256)).astype(np.float32)
    v = rng.standard_normal((300, 256)).astype(np.float32)
    q = rng.standard_normal((20, 1536)).astype(np.float32)
    pos = [5, 150, 299] + list(range(200, 217))
    outs = {}
    for isa in ("avx2", "avx512"):
        if isa not in available_isas():
            continue
        outs[isa] = attention(minfer._minfer.Session(model, threads=2, isa=isa), q, k, v, pos, 12, 2, 128)
    if "avx512" in outs:
        assert np.array_equal(outs["avx2"], outs["avx512"])
    scalar = minfer._minfer.Session(model, threads=2, isa="scalar")
    force("cpu.attention", "f32")
    assert np.array_equal(attention(scalar, q, k, v, pos, 12, 2, 128), attention(
        minfer._minfer.Session(model, threads=2), q, k, v, pos, 12, 2, 128))
    assert not np.array_equal(outs["avx2"], attention(scalar, q, k, v, pos, 12, 2, 128))
    force("cpu.attention", "tiles")
    with pytest.raises(Exception, match="cpu.attention=tiles cannot run here"):
        attention(scalar, q, k, v, [299], 12, 2, 128)
