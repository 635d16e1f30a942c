"""Distances between our logits and llama.cpp's fixture logits (top-K form)."""
from __future__ import annotations

import numpy as np


def lse(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0]


def best_of(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k best by value descending, then index (numpy's lexsort; the sampler's top-k order): (values,
    int32 indices), [..., k] for rows [..., n]."""
    flat = rows.reshape(-1, rows.shape[-1])
    order = np.stack([np.lexsort((np.arange(r.size), -r.astype(np.float64)))[:k] for r in flat])
    vals = np.take_along_axis(flat, order, 1)
    return vals.reshape(*rows.shape[:-1], -1), order.astype(np.int32).reshape(*rows.shape[:-1], -1)


def compare_topk(ours: np.ndarray, topk_ids: np.ndarray, topk_logits: np.ndarray, ref_lse: np.ndarray) -> dict:
    """ours: [n, V] full logits; the reference gives its top-K ids/logits and full-vocab lse per row.
    KL(ref || ours) over the K ids plus one 'rest' bucket (a lower bound of the full KL)."""
    mine = np.take_along_axis(ours, topk_ids, axis=1).astype(np.float64)
    d = np.abs(mine - topk_logits)
    lp_ref = topk_logits.astype(np.float64) - ref_lse[:, None]
    lp_our = mine - lse(ours)[:, None]
    p_ref, p_our = np.exp(lp_ref), np.exp(lp_our)
    rest_ref = np.clip(1 - p_ref.sum(1), 1e-12, 1)
    rest_our = np.clip(1 - p_our.sum(1), 1e-12, 1)
    kl = (p_ref * (lp_ref - lp_our)).sum(1) + rest_ref * np.log(rest_ref / rest_our)
    return {
        "max_abs": float(d.max()), "mean_abs": float(d.mean()),
        "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
        "top1_agree": float((ours.argmax(1) == topk_ids[:, 0]).mean()),
        "lse_max_abs": float(np.abs(lse(ours) - ref_lse).max()),
    }


def full_kl(ref_logits: np.ndarray, ours: np.ndarray) -> float:
    lp = ref_logits.astype(np.float64) - lse(ref_logits)
    lq = ours.astype(np.float64) - lse(ours)
    return float((np.exp(lp) * (lp - lq)).sum())
