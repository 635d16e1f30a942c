"""Rung 1 for the Metal backend's attention kernels, on Linux, in the MSL emulator (test_metal_kernels.py says
how): the KV store and attention over contiguous, sliding-window and ring caches, paged pools, long contexts,
RoPE fused with the store, and prefill on simdgroup matrices, against float64 numpy."""
import numpy as np
import pytest

from attention_ref import causal_attention_f64
from minfer.quants import dequantize, quantize_act
from msl_harness import k, pack  # noqa: F401 (k: the emulated kernels, a fixture)


def cached(rows, kv_type):
    """The values a cache of kv_type (ggml's id: 0 f32, 1 f16, 8 q8_0) holds for these f32 rows, in float64; the CPU's
    q8_0 quantizer is the definition of what a q8_0 cache holds."""
    if kv_type == 8:
        return np.stack([dequantize(quantize_act(r, 8), 8) for r in rows]).astype(np.float64)
    return (rows.astype(np.float16) if kv_type else rows).astype(np.float64)


@pytest.mark.parametrize("kv_type", [0, 1, 8], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("rows,first", [(1, 260), (5, 20)], ids=["decode", "prefill"])
@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(14, 2, 64), (12, 2, 128)])
@pytest.mark.parametrize("window,ring", [(0, 0), (100, 0), (12, 0), (100, 160)], ids=["causal", "window", "window12",
                                                                                      "ring"])
def test_kv_store_and_attention(k, rng, kv_type, rows, first, n_head, n_head_kv, head_dim, window, ring):
    """Stores then attention over the cache: causal, or a sliding window (gemma's local layers), whose cache
    may be a ring of rows (position p in row p % ring; 160 rows hold the window and a step)."""
    n_ctx, dim = 300, n_head_kv * head_dim
    row_bytes = {0: 4 * dim, 1: 2 * dim, 8: dim // 32 * 34}[kv_type]
    K = np.zeros((ring or n_ctx) * row_bytes, np.uint8)
    V = np.zeros_like(K)
    # positions before `first` hold earlier tokens' rows (written by an earlier store)
    hist_k = rng.standard_normal((first, dim)).astype(np.float32)
    hist_v = rng.standard_normal((first, dim)).astype(np.float32)
    err = np.zeros(1, np.uint32)
    store = lambda kk, vv, p: k.dispatch(  # noqa: E731
        "kv_store", {0: pack("IIIIII", dim, n_ctx, dim, dim, kv_type, ring), 1: kk, 2: vv, 3: p, 4: K, 5: V, 6: err},
        grid=((dim + 63) // 64, len(p), 1), tg=(64, 1, 1))
    for c in range(0, first, 64):  # earlier steps (a ring wraps over them)
        store(hist_k[c:c + 64], hist_v[c:c + 64], np.arange(c, min(first, c + 64), dtype=np.int32))
    kn = (rng.standard_normal((rows, dim)) * 2).astype(np.float32)
    vn = rng.standard_normal((rows, dim)).astype(np.float32)
    pos = (np.arange(rows) + first).astype(np.int32)
    store(kn, vn, pos)
    assert err[0] == 0
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    out = np.full((rows, n_head * head_dim), np.nan, np.float32)
    scale = 1 / np.sqrt(head_dim)
    k.dispatch("attention", {0: pack("IIIIIIIfIIII", n_head, n_head_kv, head_dim, n_ctx, n_head * head_dim,
                                     n_head * head_dim, kv_type, scale, 1, rows, window, ring),
                             1: q, 2: pos, 3: K, 4: V, 5: out},
               grid=(n_head, rows, 1), tg=(128, 1, 1), tg_bytes={0: 128 * 4, 1: 4 * 4})
    n = first + rows
    held = np.arange(max(0, n - ring) if ring else 0, n)  # the positions the cache still holds
    cast = lambda a: cached(a, kv_type)  # noqa: E731
    if kv_type == 8:
        stored = np.stack([dequantize(K[j * row_bytes:(j + 1) * row_bytes], 8) for j in held % (ring or n_ctx)])
    else:
        stored = K.view(np.float16 if kv_type else np.float32).reshape(ring or n_ctx, dim)[held % (ring or n_ctx)]
    Kc = cast(np.concatenate([hist_k, kn]))
    Vc = cast(np.concatenate([hist_v, vn]))
    assert np.array_equal(stored.astype(np.float64), Kc[held])  # the store wrote exactly the rounded rows in their rows
    g = n_head // n_head_kv
    ref = np.zeros((rows, n_head * head_dim))
    for r in range(rows):
        lo = max(0, pos[r] - window + 1) if window else 0
        for h in range(n_head):
            cs = slice((h // g) * head_dim, (h // g + 1) * head_dim)
            s = Kc[lo: pos[r] + 1, cs] @ q[r, h * head_dim:(h + 1) * head_dim].astype(np.float64) * scale
            p = np.exp(s - s.max())
            ref[r, h * head_dim:(h + 1) * head_dim] = (p / p.sum()) @ Vc[lo: pos[r] + 1, cs]
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    if rows == 1:  # the KV-split variant (3 splits: blocks 0..2 take chunks 0, 1, 2 of the visible positions)
        S = 3
        partial = np.full(n_head * S * (head_dim + 2), np.nan, np.float32)
        split = np.full_like(out, np.nan)
        args = pack("IIIIIIIfIIII", n_head, n_head_kv, head_dim, n_ctx, n_head * head_dim, n_head * head_dim, kv_type,
                    scale, S, 1, window, ring)
        k.dispatch("attention_split", {0: args, 1: q, 2: pos, 3: K, 4: V, 5: partial}, grid=(n_head, 1, S),
                   tg=(128, 1, 1), tg_bytes={0: 128 * 4, 1: 4 * 4})
        k.dispatch("attention_combine", {0: args, 1: partial, 2: split}, grid=(n_head, 1, 1), tg=(64, 1, 1))
        assert np.abs(split - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("kv_type", [0, 1, 8], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(14, 2, 64), (4, 2, 256)])
@pytest.mark.parametrize("window", [0, 20], ids=["causal", "window"])
def test_paged_kv_store_and_attention(k, rng, kv_type, n_head, n_head_kv, head_dim, window):
    """A batch step over a pool of KV blocks: three sequences whose blocks are scattered over the pool (tables
    shuffled), earlier tokens stored at their pool rows, then a ragged step (one decode row, a 4-row prompt chunk,
    one decode row in a sequence spanning 5 blocks) stored and attended by attention_paged, each row against
    float64 attention over its own sequence's positions.  A table entry past the pool is clamped, not followed
    (the ASan build of this test reads nothing outside the pool)."""
    bs, n_blocks, max_blocks = 16, 12, 6
    dim = n_head_kv * head_dim
    row_bytes = {0: 4 * dim, 1: 2 * dim, 8: dim // 32 * 34}[kv_type]
    K = np.zeros(n_blocks * bs * row_bytes, np.uint8)
    V = np.zeros_like(K)
    blocks = rng.permutation(n_blocks)
    lens, new = [9, 20, 75], [1, 4, 1]  # tokens each sequence has after the step; of them this step's
    tables = np.full((3, max_blocks), 1000, np.int32)  # entries past a sequence's blocks: outside the pool
    used = 0
    for s, n in enumerate(lens):
        nb = -(-n // bs)
        tables[s, :nb] = blocks[used:used + nb]
        used += nb
    err = np.zeros(1, np.uint32)

    def store(kk, vv, slots):
        k.dispatch("kv_store", {0: pack("IIIIII", dim, n_blocks * bs, dim, dim, kv_type, 0), 1: kk, 2: vv, 3: slots,
                                4: K, 5: V, 6: err}, grid=((dim + 63) // 64, len(slots), 1), tg=(64, 1, 1))

    slot = lambda s, p: tables[s, p // bs] * bs + p % bs  # noqa: E731
    Ks = [(rng.standard_normal((n, dim)) * 2).astype(np.float32) for n in lens]
    Vs = [rng.standard_normal((n, dim)).astype(np.float32) for n in lens]
    for s, n in enumerate(lens):  # the earlier steps
        old = n - new[s]
        store(Ks[s][:old].copy(), Vs[s][:old].copy(), np.array([slot(s, p) for p in range(old)], np.int32))
    seq = np.concatenate([[s] * new[s] for s in range(3)]).astype(np.int32)
    pos = np.concatenate([np.arange(lens[s] - new[s], lens[s]) for s in range(3)]).astype(np.int32)
    store(np.concatenate([Ks[s][-new[s]:] for s in range(3)]), np.concatenate([Vs[s][-new[s]:] for s in range(3)]),
          np.array([slot(s, p) for s, p in zip(seq, pos)], np.int32))
    assert err[0] == 0
    rows = len(pos)
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    out = np.full((rows, n_head * head_dim), np.nan, np.float32)
    scale = 1 / np.sqrt(head_dim)
    k.dispatch("attention_paged", {0: pack("IIIIIIfIIIII", n_head, n_head_kv, head_dim, n_head * head_dim,
                                           n_head * head_dim, kv_type, scale, window, bs, n_blocks, max_blocks, 3),
                                   1: q, 2: pos, 3: seq, 4: tables, 5: K, 6: V, 7: out},
               grid=(n_head, rows, 1), tg=(128, 1, 1), tg_bytes={0: 128 * 4, 1: 4 * 4})
    ref = np.zeros_like(out, np.float64)
    for r in range(rows):
        s, p = seq[r], pos[r]
        lo = max(0, p - window + 1) if window else 0
        Kc, Vc = cached(Ks[s][lo:p + 1], kv_type), cached(Vs[s][lo:p + 1], kv_type)
        ref[r] = causal_attention_f64(q[r:r + 1], Kc, Vc, [p - lo], n_head, n_head_kv, head_dim)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    # a row whose table points past the pool (the host refuses such a step; the kernel still stays inside)
    tables[2, :] = [n_blocks + 5, -3, 10**6, 7, 0, 1]
    k.dispatch("attention_paged", {0: pack("IIIIIIfIIIII", n_head, n_head_kv, head_dim, n_head * head_dim,
                                           n_head * head_dim, kv_type, scale, window, bs, n_blocks, max_blocks, 3),
                                   1: q, 2: pos, 3: seq, 4: tables, 5: K, 6: V, 7: out},
               grid=(n_head, rows, 1), tg=(128, 1, 1), tg_bytes={0: 128 * 4, 1: 4 * 4})
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("n_ctx", [16384, 32768])
def test_attention_at_long_context(k, rng, n_ctx):
    """The kernels a long context takes, over a full f16 cache (4 query heads over 2 KV heads, head_dim 128):
    decode at the last position by the one-row kernel and by the splits (one per 512 positions, as the
    backend dispatches: 32 or 64) and their combine, and 16 prefill rows at the end on simdgroup matrices
    (two tiles of 8 rows walking every key tile).  Keys are scaled so each row's weight sits on a few
    positions: a chunk or split skipped anywhere moves the output far past the bound."""
    n_head, n_head_kv, head_dim = 4, 2, 128
    dim = n_head_kv * head_dim
    K = (rng.standard_normal((n_ctx, dim)) * 4).astype(np.float16)
    V = rng.standard_normal((n_ctx, dim)).astype(np.float16)
    Kd, Vd = K.astype(np.float64), V.astype(np.float64)
    scale = 1 / np.sqrt(head_dim)

    def args(S, rows):
        return pack("IIIIIIIfIIII", n_head, n_head_kv, head_dim, n_ctx, n_head * head_dim, n_head * head_dim, 1, scale,
                    S, rows, 0, 0)

    q = rng.standard_normal((1, n_head * head_dim)).astype(np.float32)
    pos = np.array([n_ctx - 1], np.int32)
    ref = causal_attention_f64(q, Kd, Vd, pos, n_head, n_head_kv, head_dim)
    one = np.full((1, n_head * head_dim), np.nan, np.float32)
    k.dispatch("attention", {0: args(1, 1), 1: q, 2: pos, 3: K, 4: V, 5: one}, grid=(n_head, 1, 1), tg=(128, 1, 1),
               tg_bytes={0: 128 * 4, 1: 4 * 4})
    assert np.abs(one - ref).max() <= 1e-5 * np.abs(ref).max()
    S = n_ctx // 512
    partial = np.full(n_head * S * (head_dim + 2), np.nan, np.float32)
    split = np.full_like(one, np.nan)
    k.dispatch("attention_split", {0: args(S, 1), 1: q, 2: pos, 3: K, 4: V, 5: partial}, grid=(n_head, 1, S),
               tg=(128, 1, 1), tg_bytes={0: 128 * 4, 1: 4 * 4})
    k.dispatch("attention_combine", {0: args(S, 1), 1: partial, 2: split}, grid=(n_head, 1, 1), tg=(64, 1, 1))
    assert np.abs(split - ref).max() <= 1e-5 * np.abs(ref).max()

    rows = 16
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    pos = np.arange(n_ctx - rows, n_ctx, dtype=np.int32)
    out = np.full((rows, n_head * head_dim), np.nan, np.float32)
    k.dispatch("attention_prefill", {0: args(1, rows), 1: q, 2: pos, 3: K, 4: V, 5: out}, grid=(n_head, 2, 1),
               tg=(128, 1, 1), tg_bytes={0: 8 * head_dim * 4, 1: 16 * head_dim * 4, 2: 16 * head_dim * 4,
                                         3: 8 * 16 * 4, 4: 8 * head_dim * 4, 5: 3 * 8 * 4})
    ref = causal_attention_f64(q, Kd, Vd, pos, n_head, n_head_kv, head_dim)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("kv_type", [0, 1, 8], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("neox,head_dim,rope_dim", [(True, 128, 128), (False, 64, 32)])
@pytest.mark.parametrize("paged", [False, True], ids=["positions", "pool-rows"])
def test_rope_kv_store_is_rope_then_kv_store(k, rng, kv_type, neox, head_dim, rope_dim, paged):
    """The decode fusion computes exactly what the rope and kv_store kernels compute: the same rotated q,
    the same cache bytes, stored at the rows' positions or (a batch step's) at their pool rows while rotated at
    their positions; a row outside the cache flags the error word and stores nothing."""
    rows, n_head, n_head_kv, n_ctx = 3, 12, 2, 64
    qc, dim = n_head * head_dim, n_head_kv * head_dim
    row_bytes = {0: 4 * dim, 1: 2 * dim, 8: dim // 32 * 34}[kv_type]
    q = rng.standard_normal((rows, qc)).astype(np.float32)
    kx = (rng.standard_normal((rows, dim)) * 2).astype(np.float32)
    v = rng.standard_normal((rows, dim)).astype(np.float32)
    pos = np.array([40, 7, 63], np.int32)
    at = np.array([17, 50, 2], np.int32) if paged else pos  # where each row is stored
    freq = (1e6 ** (-2.0 * np.arange(rope_dim // 2) / rope_dim)).astype(np.float32)
    # unfused: rope q, rope k, store
    yq, yk = np.full_like(q, np.nan), np.full_like(kx, np.nan)
    for x, y, c in ((q, yq, qc), (kx, yk, dim)):
        k.dispatch("rope", {0: pack("IIIIII", c, head_dim, rope_dim, c, c, int(neox)), 1: x, 2: pos, 3: freq, 4: y},
                   grid=((c // 2 + 63) // 64, rows, 1), tg=(64, 1, 1))
    K1, V1 = np.zeros(n_ctx * row_bytes, np.uint8), np.zeros(n_ctx * row_bytes, np.uint8)
    err = np.zeros(1, np.uint32)
    k.dispatch("kv_store", {0: pack("IIIIII", dim, n_ctx, dim, dim, kv_type, 0), 1: yk, 2: v, 3: at, 4: K1, 5: V1,
                            6: err},
               grid=((dim + 63) // 64, rows, 1), tg=(64, 1, 1))
    assert K1.reshape(n_ctx, row_bytes)[at].any(axis=1).all()
    # fused
    y = np.full_like(q, np.nan)
    K2, V2 = np.zeros_like(K1), np.zeros_like(V1)
    args = pack("I" * 13, qc, dim, head_dim, rope_dim, int(neox), qc, dim, dim, qc, n_ctx, kv_type, 0, int(paged))
    fused = lambda p, r: k.dispatch(  # noqa: E731
        "rope_kv_store", {0: args, 1: q, 2: kx, 3: v, 4: p, 5: freq, 6: y, 7: K2, 8: V2, 9: err, 10: r},
        grid=(rows, 1, 1), tg=(128, 1, 1), tg_bytes={0: dim * 4})
    fused(pos, at)
    assert err[0] == 0
    assert np.array_equal(y, yq) and np.array_equal(K2, K1) and np.array_equal(V2, V1)
    K2[:] = 0
    bad = np.array([40, 64, 3], np.int32)  # row 1 is past the cache
    fused(pos if paged else bad, bad if paged else pos)
    assert err[0] == 2
    written = K2.reshape(n_ctx, row_bytes).any(axis=1)
    assert written[40] and written[3] and written.sum() == 2


@pytest.mark.parametrize("n_head,n_head_kv,head_dim", [(14, 2, 64), (12, 2, 128)])
@pytest.mark.parametrize("window,ring", [(0, 0), (11, 0), (11, 48)], ids=["causal", "window", "ring"])
def test_prefill_attention_on_simdgroup_matrices(k, rng, n_head, n_head_kv, head_dim, window, ring):
    """37 query rows at positions 20..56 over an f16 cache (rows 0..19 hold earlier tokens): 5 tiles of 8
    rows, the last partial; f32 arithmetic, so the bound of the one-row kernel.  With a window of 11 (not a
    multiple of the 16-key tiles), and with the cache a ring of 48 rows (positions 9..56, row p % 48)."""
    rows, first, n_ctx, dim = 37, 20, 128, n_head_kv * head_dim
    kk = (rng.standard_normal((first + rows, dim)) * 2).astype(np.float16)
    vv = rng.standard_normal((first + rows, dim)).astype(np.float16)
    K = np.zeros((ring or n_ctx, dim), np.float16)
    V = np.zeros_like(K)
    for p in range(first + rows):  # what stores in position order leave
        K[p % (ring or n_ctx)], V[p % (ring or n_ctx)] = kk[p], vv[p]
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    pos = (np.arange(rows) + first).astype(np.int32)
    out = np.full((rows, n_head * head_dim), np.nan, np.float32)
    scale = 1 / np.sqrt(head_dim)
    args = pack("IIIIIIIfIIII", n_head, n_head_kv, head_dim, n_ctx, n_head * head_dim, n_head * head_dim, 1, scale, 1,
                rows, window, ring)
    k.dispatch("attention_prefill", {0: args, 1: q, 2: pos, 3: K, 4: V, 5: out}, grid=(n_head, 5, 1), tg=(128, 1, 1),
               tg_bytes={0: 8 * head_dim * 4, 1: 16 * head_dim * 4, 2: 16 * head_dim * 4, 3: 8 * 16 * 4,
                         4: 8 * head_dim * 4, 5: 3 * 8 * 4})
    Kd, Vd = kk.astype(np.float64), vv.astype(np.float64)
    g = n_head // n_head_kv
    ref = np.zeros((rows, n_head * head_dim))
    for h in range(n_head):
        cs = slice((h // g) * head_dim, (h // g + 1) * head_dim)
        for r in range(rows):
            lo = max(0, pos[r] - window + 1) if window else 0
            s = Kd[lo: pos[r] + 1, cs] @ q[r, h * head_dim:(h + 1) * head_dim].astype(np.float64) * scale
            p = np.exp(s - s.max())
            ref[r, h * head_dim:(h + 1) * head_dim] = (p / p.sum()) @ Vd[lo: pos[r] + 1, cs]
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
