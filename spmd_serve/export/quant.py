"""Weight-only quantisation of the linear layers (`spmd_serve export --quant`), numpy side.

* `weight_only_int8`: symmetric, one fp32 scale per output channel; q = clip(rint(w / s), -127, 127).
* `weight_only_int4`: symmetric, one fp32 scale per output channel and group of `group` input units;
  q in [-7, 7], packed two per int8 byte along the input dim (row 2i in the low nibble, 2i+1 in
  the high one), so a [in, out] weight is stored as [in/2, out] int8 plus [in/group, out] scales.

Embedding tables and lm_heads are held as an [H, V_local] linear (`quantize_vocab`): one scale per
vocab row (int8) or per vocab row and group of hidden units (int4).  Scales are computed on the
*unsharded* HF weight and then sliced like the weight: a column shard keeps its output channels'
scales, a row shard keeps the full per-channel scale (int8) or its own input groups (int4).  Every
rank therefore holds exactly the integers the TP=1 export holds, so a TP=N export computes what the
TP=1 one does.  Which tensors a family quantises: its own module (export/llama/quant.py).  The graph
side (dequantise right before each matmul, or after the embedding gather) is export/layers.py.
`bf16_bits`: an fp32 weight rounded to bfloat16 (`--dtype bfloat16`: weight-only, the graph computes in
fp32, export/layers.py), as the uint16 bits Paddle takes as a bfloat16 tensor.
`QuantStack`: a stack of [in, out] weights (DeepSeek's routed experts, MLA's absorbed projections),
each quantised on its own; deepseek/batched.py is its graph side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spmd_serve.export.errors import QuantError
from spmd_serve.manifest import QUANT_METHODS, QuantRecord

__all__ = [
    "QMAX",
    "QUANT_METHODS",
    "QuantError",
    "QuantWeight",
    "bf16_bits",
    "choose_group",
    "from_bf16_bits",
    "f16_valued",
    "bf16_valued",
    "dequantize",
    "hf_scales",
    "quant_weight",
    "quantize",
    "quantize_vocab",
    "shard_vocab",
    "record",
]
QMAX = {"weight_only_int8": 127, "weight_only_int4": 7}
DEFAULT_INT4_GROUP = 64


def bf16_bits(w: np.ndarray) -> np.ndarray:
    """w (float32) rounded to bfloat16 to nearest even, as its uint16 bits (the high half of the rounded
    float32: Paddle's bfloat16).  Denormals round as the rest; NaN stays NaN (a quiet one)."""
    u = np.ascontiguousarray(w, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # may carry into the exponent: correct
    return np.where(np.isnan(w), (u >> 16).astype(np.uint16) | np.uint16(0x40), bits)


def _all_chunks(arrays: Iterable[np.ndarray], ok, chunk: int) -> bool:
    """Whether ok(part) for every `chunk` elements of every float32 array (no weight-sized temporary),
    stopping at the first part that is not."""
    for a in arrays:
        flat = np.ascontiguousarray(a, np.float32).reshape(-1)
        if not all(ok(flat[i : i + chunk]) for i in range(0, flat.size, chunk)):
            return False
    return True


def bf16_valued(arrays: Iterable[np.ndarray], chunk: int = 1 << 24) -> bool:
    """Whether every element of these float32 arrays is a bfloat16 value (its low 16 bits zero): then
    bf16_bits loses nothing."""
    return _all_chunks(arrays, lambda p: not (p.view(np.uint32) & 0xFFFF).any(), chunk)


def f16_valued(arrays: Iterable[np.ndarray], chunk: int = 1 << 24) -> bool:
    """Whether every element of these float32 arrays is a float16 value (float16 holds it exactly)."""
    with np.errstate(over="ignore"):
        return _all_chunks(arrays, lambda p: np.array_equal(p.astype(np.float16).astype(np.float32), p), chunk)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) → the float32 they stand for, exactly."""
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class QuantWeight:
    """A quantised [in, out] linear weight of one rank: `q` int8 ([in, out], or [in/2, out] packed
    int4) and fp32 `scale` ([out], or [in/group, out])."""

    method: str
    q: np.ndarray
    scale: np.ndarray
    group: int | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.q.shape[0] * (2 if self.method == "weight_only_int4" else 1), self.q.shape[1])


def choose_group(ins: Mapping[str, int], tp: int, group: int | None) -> int:
    """int4 group size: `group` if given (must divide every linear's input size per rank, `ins`: what
    → size), else the largest of 64, 32, ..., 8 that does."""
    if group is not None:
        bad = {k: v for k, v in ins.items() if v % group}
        if group < 2 or group % 2 or bad:
            raise QuantError(
                f"--quant-group {group} must be even and divide each linear's input size per rank "
                f"({', '.join(f'{k} {v}' for k, v in ins.items())} at tp={tp})"
            )
        return group
    g = DEFAULT_INT4_GROUP
    while g >= 8:
        if all(v % g == 0 for v in ins.values()):
            return g
        g //= 2
    raise QuantError(f"no int4 group size in 64..8 divides the per-rank input sizes {ins} at tp={tp}")


def _group(group: int | None) -> int:
    """int4's group size (int8 has none: asking for it is a bug)."""
    if group is None:
        raise ValueError("weight_only_int4 needs a group size")
    return group


def hf_scales(w_hf: np.ndarray, method: str, group: int | None) -> np.ndarray:
    """Scales of an HF [out, in] weight: int8 [out]; int4 [out, in/group]."""
    a = np.abs(np.asarray(w_hf, np.float32))
    amax = a.max(axis=1) if method == "weight_only_int8" else a.reshape(a.shape[0], -1, _group(group)).max(axis=2)
    return (np.maximum(amax, np.float32(1e-8)) / np.float32(QMAX[method])).astype(np.float32)


def quantize(w: np.ndarray, scale: np.ndarray, method: str, group: int | None) -> np.ndarray:
    """[in, out] fp32 weight with its (Paddle-layout) scales → the stored int8 array."""
    full = scale[None, :] if method == "weight_only_int8" else np.repeat(scale, _group(group), axis=0)
    q = np.clip(np.rint(np.asarray(w, np.float32) / full), -QMAX[method], QMAX[method]).astype(np.int8)
    if method == "weight_only_int8":
        return q
    lo, hi = q[0::2].astype(np.uint8), q[1::2].astype(np.uint8)
    return ((lo & 0x0F) | (hi << 4)).astype(np.uint8).view(np.int8)


def dequantize(qw: QuantWeight) -> np.ndarray:
    """numpy reference of the in-graph dequantisation: the fp32 [in, out] weight the graph uses."""
    if qw.method == "weight_only_int8":
        return qw.q.astype(np.float32) * qw.scale[None, :]
    p = qw.q.astype(np.int16)
    lo, hi = ((p << 12) >> 12), p >> 4  # sign-extend the low nibble; arithmetic shift the high one
    q = np.stack([lo, hi], axis=1).reshape(-1, qw.q.shape[1]).astype(np.float32)
    return q * np.repeat(qw.scale, _group(qw.group), axis=0)


def quant_weight(w: np.ndarray, s_hf: np.ndarray, method: str, group: int | None) -> QuantWeight:
    """An [in, out] fp32 weight and its scales in HF layout ([out], or [out, in/group]) → QuantWeight."""
    scale = np.ascontiguousarray(s_hf if method == "weight_only_int8" else s_hf.T, np.float32)
    return QuantWeight(method, quantize(w, scale, method, group), scale, group)


def quantize_vocab(w_hf: np.ndarray, method: str, group: int | None) -> QuantWeight:
    """A rank's [V_local, H] embedding or lm_head rows → the QuantWeight of the [H, V_local] linear.
    Every vocab row lives whole on one rank, so scales computed here are the unsharded ones."""
    return quant_weight(np.ascontiguousarray(w_hf.T), hf_scales(w_hf, method, group), method, group)


def shard_vocab(shard: Mapping[str, Any], name: str, method: str, group: int | None) -> QuantWeight:
    """A rank shard's `embed` [V_local, H] or `lm_head` [H, V_local] quantised as an [H, V_local]
    linear (quantize_vocab: the lm_head as its transpose)."""
    w = shard[name]
    return quantize_vocab(w if name == "embed" else w.T, method, group)


def record(method: str | None, group: int | None, tensors: tuple[str, ...], unquantised: tuple[str, ...]):
    """What config.json's `spmd_serve.quant` (and each rank's manifest.json) holds for an export whose
    family quantises `tensors` (lm_head and the embedding table, held as below, included)."""
    if method is None:
        return None
    return QuantRecord(
        method=method,
        bits=8 if method == "weight_only_int8" else 4,
        group_size=group if method == "weight_only_int4" else None,
        scales="per output channel" + (f" and group of {group} input units" if group else ""),
        tensors=(*tensors, "lm_head", "embed"),
        embed="held as the [hidden, vocab] linear (scale per vocab row"
        + (", per group" if group else "")
        + "); a step's rows are gathered, then dequantised",
        unquantised=unquantised,
    )


@dataclass(frozen=True)
class QuantStack:
    """Quantised [N, in, out] weights: `q` [N, in or in/2, out] int8, `scale` [N, out] or [N, in/g, out]."""

    method: str
    q: np.ndarray
    scale: np.ndarray
    group: int | None = None


def quantize_stack(w: np.ndarray, method: str, group: int | None) -> QuantStack:
    """Each [in, out] weight of the stack quantised on its own (scales from itself: it is whole here)."""
    parts: list[QuantWeight] = [quant_weight(x, hf_scales(x.T, method, group), method, group) for x in w]
    return QuantStack(method, np.stack([p.q for p in parts]), np.stack([p.scale for p in parts]), group)


def dequantize_stack(s: QuantStack) -> np.ndarray:
    """numpy reference of the in-graph dequantisation."""
    return np.stack([dequantize(QuantWeight(s.method, q, sc, s.group)) for q, sc in zip(s.q, s.scale)])
