"""Causal GQA attention in float64: the reference the long-context kernel tests compare against."""
import numpy as np


def causal_attention_f64(q, k, v, pos, n_head, n_head_kv, head_dim):
    """Row r of q (n_head heads of head_dim) attends to keys 0..pos[r] of k and v (float64 arrays of the values
    the cache holds, n_head_kv heads); query head h reads KV head h // (n_head // n_head_kv)."""
    g = n_head // n_head_kv
    visible = np.arange(len(k))[None, :] <= np.asarray(pos)[:, None]
    out = np.zeros((len(q), n_head * head_dim))
    for h in range(n_head):
        cs = slice((h // g) * head_dim, (h // g + 1) * head_dim)
        sc = q[:, h * head_dim:(h + 1) * head_dim].astype(np.float64) @ k[:, cs].T / np.sqrt(head_dim)
        sc = np.where(visible, sc, -np.inf)
        w = np.exp(sc - sc.max(1, keepdims=True))
        out[:, h * head_dim:(h + 1) * head_dim] = (w / w.sum(1, keepdims=True)) @ v[:, cs]
    return out


UH = 2.0 ** -11  # f16 unit roundoff


def f16_attention_bound(q, k, v, n_head, n_head_kv, head_dim):
    """The most a tensor-core attention may differ from the exact one over an f16 cache (k, v: the values it
    holds), with q and the probabilities rounded to f16: a score moves by at most UH * scale * sum |q||k|, a
    weight by that (as a factor e^ds) and by UH (its own rounding), so the output by about 2 (max ds + UH)
    max |v|."""
    g = n_head // n_head_kv
    kk = np.abs(np.asarray(k, np.float64))
    ds = max((np.abs(q[:, h * head_dim:(h + 1) * head_dim]) @ kk[:, (h // g) * head_dim:(h // g + 1) * head_dim].T).max()
             for h in range(n_head)) * UH / np.sqrt(head_dim)
    return 2.2 * (ds + UH) * np.abs(v).max()
