"""Weight-only quantisation of the linear layers (`spmd_serve export --quant`), numpy side.

* `weight_only_int8`: symmetric, one fp32 scale per output channel; q = clip(rint(w / s), -127, 127).
* `weight_only_int4`: symmetric, one fp32 scale per output channel and group of `group` input units;
  q in [-7, 7], packed two per int8 byte along the input dim (row 2i in the low nibble, 2i+1 in
  the high one), so a [in, out] weight is stored as [in/2, out] int8 plus [in/group, out] scales.

q/k/v/o/gate/up/down, lm_head and the embedding table are quantised (norms and biases stay fp32).
The embedding table and lm_head are both held as an [H, V_local] linear (`quantize_vocab`): one
scale per vocab row (int8) or per vocab row and group of hidden units (int4).  Scales are
computed on the *unsharded* HF weight and then sliced like the weight (`linear_slices`): a
column shard keeps its output channels' scales, a row shard (o, down) keeps the full per-channel
scale (int8) or its own input groups (int4).  Every rank therefore holds exactly the integers the
TP=1 export holds, so a TP=N export computes what the TP=1 one does.  The graph side (dequantise
right before each matmul, or after the embedding gather) is `llama.Linear` and `llama.EmbedStage`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spmd_serve.models.arch import ModelConfig
from spmd_serve.models.sharding import LINEARS, ShardDims, linear_slices

QUANT_METHODS = ("weight_only_int8", "weight_only_int4")
QMAX = {"weight_only_int8": 127, "weight_only_int4": 7}
DEFAULT_INT4_GROUP = 64


class QuantError(ValueError):
    """The model cannot be quantised this way (message says why and what would work)."""


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


def local_in_dims(dims: ShardDims) -> dict[str, int]:
    return {"hidden": dims.hidden, "attention output": dims.heads * dims.head_dim,
            "intermediate": dims.intermediate}


def choose_group(dims: ShardDims, group: int | None) -> int:
    """int4 group size: `group` if given (must divide every linear's local input dim), else the
    largest of 64, 32, ..., 8 that does."""
    ins = local_in_dims(dims)
    if group is not None:
        bad = {k: v for k, v in ins.items() if v % group}
        if group < 2 or group % 2 or bad:
            raise QuantError(f"--quant-group {group} must be even and divide each linear's input size per rank "
                             f"({', '.join(f'{k} {v}' for k, v in ins.items())} at tp={dims.tp})")
        return group
    g = DEFAULT_INT4_GROUP
    while g >= 8:
        if all(v % g == 0 for v in ins.values()):
            return g
        g //= 2
    raise QuantError(f"no int4 group size in 64..8 divides the per-rank input sizes {ins} at tp={dims.tp}")


def hf_scales(w_hf: np.ndarray, method: str, group: int | None) -> np.ndarray:
    """Scales of an HF [out, in] weight: int8 [out]; int4 [out, in/group]."""
    a = np.abs(np.asarray(w_hf, np.float32))
    amax = a.max(axis=1) if method == "weight_only_int8" else a.reshape(a.shape[0], -1, group).max(axis=2)
    return (np.maximum(amax, np.float32(1e-8)) / np.float32(QMAX[method])).astype(np.float32)


def quantize(w: np.ndarray, scale: np.ndarray, method: str, group: int | None) -> np.ndarray:
    """[in, out] fp32 weight with its (Paddle-layout) scales → the stored int8 array."""
    full = scale[None, :] if method == "weight_only_int8" else np.repeat(scale, group, axis=0)
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
    lo, hi = ((p << 12) >> 12), p >> 4             # sign-extend the low nibble; arithmetic shift the high one
    q = np.stack([lo, hi], axis=1).reshape(-1, qw.q.shape[1]).astype(np.float32)
    return q * np.repeat(qw.scale, qw.group, axis=0)


def quant_weight(w: np.ndarray, s_hf: np.ndarray, method: str, group: int | None) -> QuantWeight:
    """An [in, out] fp32 weight and its scales in HF layout ([out], or [out, in/group]) → QuantWeight."""
    scale = np.ascontiguousarray(s_hf if method == "weight_only_int8" else s_hf.T, np.float32)
    return QuantWeight(method, quantize(w, scale, method, group), scale, group)


def quantize_vocab(w_hf: np.ndarray, method: str, group: int | None) -> QuantWeight:
    """A rank's [V_local, H] embedding or lm_head rows → the QuantWeight of the [H, V_local] linear.
    Every vocab row lives whole on one rank, so scales computed here are the unsharded ones."""
    return quant_weight(np.ascontiguousarray(w_hf.T), hf_scales(w_hf, method, group), method, group)


def quantize_shard(shard: dict, hf: dict[str, np.ndarray], mc: ModelConfig, dims: ShardDims, rank: int,
                   method: str, group: int | None) -> dict:
    """Replace the linear weights, lm_head and embedding table of one rank's `shard_weights` output
    by `QuantWeight`s whose scales are the unsharded weights' (see the module docstring)."""
    if method not in QUANT_METHODS:
        raise QuantError(f"--quant {method!r} is not one of {', '.join(QUANT_METHODS)}")
    sl = linear_slices(mc, dims, rank)
    out = dict(shard)
    for i in range(dims.num_layers):
        for name, (module, kind, key) in LINEARS.items():
            s_hf, s = hf_scales(hf[f"model.layers.{i}.{module}.weight"], method, group), sl[key]
            if kind == "cols":
                s_hf = s_hf[s]                                   # this rank's output channels
            elif method == "weight_only_int4":
                s_hf = s_hf[:, s.start // group: s.stop // group]   # this rank's input groups
            out[f"layers.{i}.{name}"] = quant_weight(shard[f"layers.{i}.{name}"], s_hf, method, group)
    out["embed"] = quantize_vocab(shard["embed"], method, group)                  # [V_local, H]
    out["lm_head"] = quantize_vocab(shard["lm_head"].T, method, group)            # [H, V_local].T
    return out


def quant_record(method: str | None, group: int | None) -> dict | None:
    """What config.json's `spmd_serve.quant` (and each rank's manifest.json) holds for an export."""
    if method is None:
        return None
    return {"method": method, "bits": 8 if method == "weight_only_int8" else 4,
            "group_size": group if method == "weight_only_int4" else None,
            "scales": "per output channel" + (f" and group of {group} input units" if group else ""),
            "tensors": [f"layers.*.{n}" for n in LINEARS] + ["lm_head", "embed"],
            "embed": "held as the [hidden, vocab] linear (scale per vocab row" + (", per group" if group else "")
                     + "); a step's rows are gathered, then dequantised",
            "unquantised": ["norms", "biases"]}
