"""Running one hand-built graph on a backend and on the float64 reference
backend (Session.run_ops, outputs poisoned first), for the op tests of every
backend (test_ops: CPU, test_cuda: CUDA)."""
import numpy as np


def run_both(sess, inputs, nodes, backend):
    """(backend's output, reference's output) of the last node; every node the backend ran must have
    written finite values (KvStore writes the cache, not its output)."""
    out = sess.run_ops(backend, inputs, nodes)
    ref = sess.run_ops("reference", inputs, nodes)
    for i, a in enumerate(out[len(inputs):]):
        if nodes[i]["op"] != "KvStore":
            assert np.all(np.isfinite(a)), f"{nodes[i]['op']}: unwritten (poisoned) or non-finite outputs"
    return out[-1], ref[-1]


def close(out, ref, rel):
    """max |out - ref| within rel of the reference's scale."""
    scale = max(float(np.abs(ref).max()), 1e-30)
    assert np.abs(out - ref).max() <= rel * scale, (np.abs(out - ref).max(), scale)


U = 2.0 ** -24


def rope_numpy(x, pos, heads, head_dim, rope_dim, base, scale, neox):
    """RoPE in float64 numpy, written from the definition (angle p * scale * base^(-2i / rope_dim))."""
    y = x.astype(np.float64).reshape(len(x), heads, head_dim).copy()
    half = rope_dim // 2
    ang = pos.astype(np.float64).reshape(-1, 1) * scale * base ** (-2.0 * np.arange(half) / rope_dim)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    i0 = np.arange(half) if neox else 2 * np.arange(half)
    i1 = i0 + half if neox else i0 + 1
    a, b = y[..., i0].copy(), y[..., i1].copy()
    y[..., i0], y[..., i1] = a * c - b * s, a * s + b * c
    return y.reshape(len(x), -1)


def check_rope(sess, backend, rng, neox, head_dim, rope_dim, scale=1.0):
    """RoPE at random positions up to 30000 (base 1e6), 12 heads: within 16 f32 ulps of the scale, and
    the unrotated tail of each head passes through unchanged.  scale: linear RoPE scaling (the reference
    is checked against numpy for it)."""
    n, heads = 7, 12
    x = rng.standard_normal((n, heads * head_dim)).astype(np.float32)
    pos = rng.integers(0, 30000, size=(n, 1)).astype(np.int32)
    out, ref = run_both(sess, [x, pos], [dict(op="Rope", inputs=[0, 1], rows=n, cols=heads * head_dim,
                                              meta=dict(head_dim=head_dim, rope_dim=rope_dim, rope_base=1e6,
                                                        rope_scale=scale, rope_neox=neox))], backend)
    close(ref, rope_numpy(x, pos, heads, head_dim, rope_dim, 1e6, scale, neox), 1e-6)
    close(out, ref, 16 * U)
    tail = out.reshape(n, heads, head_dim)[..., rope_dim:]
    assert np.array_equal(tail, x.reshape(n, heads, head_dim)[..., rope_dim:])


ELEMENTWISE = ["Add", "Mul", "Silu", "SwiGLU", "Gelu", "GeGLU", "Scale", "SoftCap"]


def check_elementwise(sess, backend, rng, op):
    """The element-wise ops over 4 rows of the 1.5B model's FFN width, within 4 f32 ulps of the output's
    scale: Scale by gemma's sqrt(640), SoftCap at 30 over logits up to ~150 (tanh well into saturation)."""
    a = (rng.standard_normal((4, 8960)) * (40 if op == "SoftCap" else 4)).astype(np.float32)
    b = rng.standard_normal((4, 8960)).astype(np.float32)
    ins = [0] if op in ("Silu", "Gelu", "Scale", "SoftCap") else [0, 1]
    meta = dict(scale=float(np.sqrt(np.float32(640)))) if op == "Scale" else dict(scale=30.0) if op == "SoftCap" else {}
    out, ref = run_both(sess, [a, b], [dict(op=op, inputs=ins, rows=4, cols=8960, meta=meta)], backend)
    close(out, ref, 4 * U)
