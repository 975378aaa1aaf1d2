"""`trident-analyze attention`: recompute attention from the captured q, k, v
and compare with the captured attn_out.

attn_out = softmax(q·kᵀ/√head_dim, causal) · v per head, with grouped-query
attention: head h reads kv head h // (n_heads / n_kv_heads). All arrays are
in global sequence order (the writer undid the zig-zag layout).
"""
from __future__ import annotations

import numpy as np

from .runfile import AnalysisError, RunFile


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True) -> np.ndarray:
    """q [S, T, H, D], k/v [S, T, Hkv, D] -> [S, T, H, D], in float64."""
    S, T, H, D = q.shape
    Hkv = k.shape[2]
    if H % Hkv:
        raise AnalysisError(f"n_heads {H} is not a multiple of n_kv_heads {Hkv}")
    group = H // Hkv
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    out = np.empty((S, T, H, D), dtype=np.float64)
    mask = np.triu(np.ones((T, T), dtype=bool), 1) if causal else None
    for s in range(S):
        for h in range(H):
            scores = q64[s, :, h, :] @ k64[s, :, h // group, :].T / np.sqrt(D)
            if mask is not None:
                scores[mask] = -np.inf
            scores -= scores.max(axis=1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=1, keepdims=True)
            out[s, :, h, :] = p @ v64[s, :, h // group, :]
    return out


def check(rf: RunFile, step: int, layer: int, causal: bool = True) -> dict:
    q, ids = rf.activation(step, layer, "q")
    k, _ = rf.activation(step, layer, "k")
    v, _ = rf.activation(step, layer, "v")
    o, _ = rf.activation(step, layer, "attn_out")
    if q.shape != o.shape or k.shape != v.shape or q.shape[:2] != k.shape[:2]:
        raise AnalysisError(f"inconsistent shapes: q {q.shape}, k {k.shape}, v {v.shape}, attn_out {o.shape}")
    ref = reference_attention(q, k, v, causal)
    err = np.abs(o.astype(np.float64) - ref)
    scale = np.linalg.norm(ref)
    return {"step": step, "layer": layer, "shape_q": list(q.shape), "shape_kv": list(k.shape),
            "samples": [int(x) for x in ids] if ids is not None else [],
            "max_abs_diff": float(err.max()),
            "rel_l2_diff": float(np.linalg.norm(err) / scale) if scale > 0 else float(np.linalg.norm(err))}
