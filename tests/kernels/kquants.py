"""K-quant blocks for the tests: the `gguf` package dequantizes Q4_K, Q5_K and Q6_K but cannot
quantize them, so these build valid blocks byte by byte, in the layout gguf's dequantization
reads (gguf/quants.py). `random_blocks` draws every packed bit at random (every scale, minimum and
high-bit pattern occurs); `quantize_kquant` encodes real weights (a plain, unoptimized rounding:
the tests need valid blocks close to the weights, not llama.cpp's best ones)."""

from __future__ import annotations

import numpy as np

KQUANTS = ("Q4_K", "Q5_K", "Q6_K")
BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
QK = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def random_blocks(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    """(n, k / 256 * bytes) uint8: random quants, scales and minimums; the fp16 factors drawn so the
    weights are of the order of 0.05-0.1 (finite, as in a real file)."""
    rng = np.random.default_rng(seed)
    nb = n * k // QK
    raw = rng.integers(0, 256, size=(nb, BYTES[qtype]), dtype=np.uint8)
    if qtype == "Q6_K":  # d at the end; 16 int8 scales, q - 32 in -32..31
        raw[:, 208:210] = _f16_bytes(rng.uniform(0.5, 1.5, nb) * 2e-5)
    else:  # d and dmin first; 6-bit scales and minimums, q up to 15 (31)
        raw[:, 0:2] = _f16_bytes(rng.uniform(0.5, 1.5, nb) * (1e-4 if qtype == "Q4_K" else 5e-5))
        raw[:, 2:4] = _f16_bytes(rng.uniform(0.5, 1.5, nb) * 1e-3)
    return raw.reshape(n, -1)


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and minimums per block (nb, 8) -> the 12 packed bytes (nb, 12)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for g in range(4):
        out[:, g] = (sc[:, g] & 63) | ((sc[:, g + 4] >> 4) << 6)
        out[:, g + 4] = (mn[:, g] & 63) | ((mn[:, g + 4] >> 4) << 6)
        out[:, g + 8] = (sc[:, g + 4] & 15) | ((mn[:, g + 4] & 15) << 4)
    return out


def quantize_kquant(w: np.ndarray, qtype: str) -> np.ndarray:
    """(n, k) fp32 -> (n, k / 256 * bytes) uint8 blocks of `qtype`."""
    n, k = w.shape
    x = w.astype(np.float32).reshape(-1, QK)
    nb = x.shape[0]
    if qtype == "Q6_K":
        g = x.reshape(nb, 16, 16)
        scale = np.abs(g).max(-1) / 31.0  # per 16 weights
        d = (np.abs(scale).max(-1) / 127.0).astype(np.float16)
        d32 = d.astype(np.float32)
        sc = np.where(d32[:, None] > 0, np.rint(scale / np.where(d32 > 0, d32, 1)[:, None]), 0).clip(-128, 127)
        step = d32[:, None] * sc
        q = np.where(step[..., None] > 0, np.rint(g / np.where(step > 0, step, 1)[..., None]), 0).clip(-32, 31)
        q = (q + 32).astype(np.uint8).reshape(nb, QK)
        ql = np.zeros((nb, 128), np.uint8)
        qh = np.zeros((nb, 64), np.uint8)
        for h in range(2):
            for t in range(4):
                v = q[:, 128 * h + 32 * t : 128 * h + 32 * t + 32]
                lo = 64 * h + 32 * (t & 1)
                ql[:, lo : lo + 32] |= (v & 15) << (4 * (t >> 1))
                qh[:, 32 * h : 32 * h + 32] |= (v >> 4) << (2 * t)
        blocks = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)
        return blocks.reshape(n, -1)
    levels = 15 if qtype == "Q4_K" else 31
    g = x.reshape(nb, 8, 32)
    lo = np.minimum(g.min(-1), 0.0)
    scale = (g.max(-1) - lo) / levels
    mins = -lo
    d = (scale.max(-1) / 63.0).astype(np.float16)
    dmin = (mins.max(-1) / 63.0).astype(np.float16)
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.where(d32[:, None] > 0, np.rint(scale / np.where(d32 > 0, d32, 1)[:, None]), 0).clip(0, 63)
    mn = np.where(dmin32[:, None] > 0, np.rint(mins / np.where(dmin32 > 0, dmin32, 1)[:, None]), 0).clip(0, 63)
    step, off = d32[:, None] * sc, dmin32[:, None] * mn
    q = np.where(step[..., None] > 0, np.rint((g + off[..., None]) / np.where(step > 0, step, 1)[..., None]), 0)
    q = q.clip(0, levels).astype(np.uint8).reshape(nb, QK)
    qs = np.zeros((nb, 128), np.uint8)
    for c in range(4):
        qs[:, 32 * c : 32 * c + 32] = (q[:, 64 * c : 64 * c + 32] & 15) | ((q[:, 64 * c + 32 : 64 * c + 64] & 15) << 4)
    parts = [_f16_bytes(d), _f16_bytes(dmin), _pack_scales(sc.astype(np.uint8), mn.astype(np.uint8))]
    if qtype == "Q5_K":
        qh = np.zeros((nb, 32), np.uint8)
        for s in range(8):
            qh |= ((q[:, 32 * s : 32 * s + 32] >> 4) & 1) << s
        parts.append(qh)
    parts.append(qs)
    return np.concatenate(parts, axis=1).reshape(n, -1)


def quantize_any(w: np.ndarray, qtype: str) -> np.ndarray:
    """gguf's own quantizer where it has one, else `quantize_kquant`."""
    if qtype in KQUANTS:
        return quantize_kquant(w, qtype)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(w.astype(np.float32), GGMLQuantizationType[qtype])
