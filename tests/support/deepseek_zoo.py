"""Tiny DeepSeek-V2/V3 checkpoints for tests (helper module, not a test file).

* `CONFIGS`: HF config.json contents of two tiny models that together cover what the reference
  reads: q_lora_rank set (V3) and null (V2), noaux_tc routing with sigmoid scoring and the
  correction bias (V3) and group-limited greedy with softmax (V2), normalised and scaled top-k
  weights, YaRN rope scaling with mscale != mscale_all_dim (both), dense first layers
  (first_k_dense_replace = 1) and an MTP layer (V3, num_nextn_predict_layers = 1);
* `make_weights(cfg)`: deterministic random HF-named float32 weights (MTP layer included), scaled
  so that logits have std ~3 and the router's choices are not near ties (the deepseek-tiny
  demo's, spmd_serve/export/demo/deepseek.py);
* `write(fmt, dir, cfg, weights)`: the checkpoint a user would have: HF single / sharded
  safetensors, the published fp8 layout (float8_e4m3fn + 128x128 `weight_scale_inv`), PaddleNLP's
  own `save_pretrained`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from spmd_serve.export.demo.deepseek import make_weights
from tests.support.model_zoo import write_hf

__all__ = ["CONFIGS", "FORMATS", "make_weights", "write", "write_bf16", "write_fp8"]

_BASE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 4,
    "topk_group": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "float32",
}
CONFIGS: dict[str, dict] = {
    "v3": dict(
        _BASE,
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        num_hidden_layers=3,
        q_lora_rank=32,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        num_nextn_predict_layers=1,
        rope_scaling={
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    ),
    "v2": dict(
        _BASE,
        architectures=["DeepseekV2ForCausalLM"],
        model_type="deepseek_v2",
        num_hidden_layers=2,
        q_lora_rank=None,
        topk_method="group_limited_greedy",
        scoring_func="softmax",
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        num_nextn_predict_layers=0,
        rope_scaling={
            "type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.5,
        },
    ),
}
FORMATS = ("hf", "hf_sharded", "hf_fp8", "paddlenlp_safetensors")


# ---------------------------------------------------------------- the published fp8 layout

FP8_BLOCK = 128


def fp8_e4m3_table() -> np.ndarray:
    """The 256 float8_e4m3fn values by byte (written from the format, independently of the exporter's
    table): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 subnormal; 0x7f/0xff NaN."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 0x7
    val = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    val = np.where((b & 0x7F) == 0x7F, np.nan, val)
    return (sign * val).astype(np.float32)


def fp8_encode(x: np.ndarray) -> np.ndarray:
    """Round float32 values (|x| <= 448) to the nearest e4m3fn byte."""
    table = fp8_e4m3_table()
    finite = np.where(np.isnan(table), np.inf, table)
    order = np.argsort(finite)
    vals = finite[order]
    idx = np.clip(np.searchsorted(vals, x), 1, len(vals) - 1)
    lo, hi = vals[idx - 1], vals[idx]
    pick = np.where(np.abs(x - lo) <= np.abs(hi - x), idx - 1, idx)
    return order[pick].astype(np.uint8)


def to_fp8(w: np.ndarray, block: int = FP8_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """A [out, in] weight → (e4m3 bytes, `weight_scale_inv` [ceil(out/block), ceil(in/block)]) such
    that fp8 * scale_inv per block x block tile approximates w (the published V3 layout: 128), within
    fp8 rounding: half a step of e4m3's 3-bit mantissa at the value's magnitude."""
    o, i = w.shape
    so, si = -(-o // block), -(-i // block)
    scale = np.zeros((so, si), np.float32)
    q = np.zeros((o, i), np.uint8)
    for r in range(so):
        for c in range(si):
            tile = (slice(r * block, (r + 1) * block), slice(c * block, (c + 1) * block))
            # a power of two: fp8 * scale is then exact in bf16, so the bf16 twin (DeepSeek's cast of
            # the fp8 weights) holds exactly the decoded weights (the model's routing flips on a
            # bf16 rounding of them: logits move by ~4, measured)
            s = np.float32(2.0 ** np.ceil(np.log2(max(np.abs(w[tile]).max(), 1e-12) / 448.0)))
            scale[r, c] = s
            q[tile] = fp8_encode(w[tile] / s)
    return q, scale


def fp8_twin(
    weights: dict[str, np.ndarray], block: int = FP8_BLOCK
) -> tuple[dict[str, tuple[str, np.ndarray]], dict[str, np.ndarray]]:
    """(the fp8 checkpoint's tensors as (safetensors dtype tag, raw array), the weights it decodes to):
    every 2-D projection in fp8 with its block scales, the rest (embeddings, norms, router, lm_head)
    in bf16, like the published V3/R1 files."""
    table = fp8_e4m3_table()
    raw: dict[str, tuple[str, np.ndarray]] = {}
    decoded: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        if w.ndim == 2 and name.endswith("proj.weight"):
            q, s = to_fp8(w, block)
            raw[name], raw[name + "_scale_inv"] = ("F8_E4M3", q), ("F32", s)
            full = np.repeat(np.repeat(s, block, 0), block, 1)[: w.shape[0], : w.shape[1]]
            decoded[name] = table[q] * full
        else:  # bf16, as published
            raw[name] = ("BF16", bf16_bits(w))
            decoded[name] = (raw[name][1].astype(np.uint32) << 16).view(np.float32)
    return raw, decoded


def bf16_bits(w: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns, rounded to nearest even."""
    bits = np.ascontiguousarray(w, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_st_raw(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """safetensors by hand (numpy has no fp8): (dtype tag, raw little-endian array) per tensor."""
    import struct

    header, blobs, off = {}, [], 0
    for name, (tag, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_fp8(
    out: Path, cfg: dict, weights: dict[str, np.ndarray], block: int = FP8_BLOCK
) -> tuple[Path, dict[str, np.ndarray]]:
    """The published fp8 layout of `weights` (config.json with its `quantization_config`); returns
    (directory, the float32 weights it holds after dequantisation)."""
    out.mkdir(parents=True, exist_ok=True)
    quant = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [block, block]}
    (out / "config.json").write_text(json.dumps(dict(cfg, quantization_config=quant, torch_dtype="bfloat16")))
    raw, decoded = fp8_twin(weights, block)
    write_st_raw(out / "model.safetensors", raw)
    return out, decoded


def write(fmt: str, out: Path, cfg: dict, weights: dict[str, np.ndarray], reference=None) -> Path:
    if fmt == "hf":
        return write_hf(out, cfg, weights)
    if fmt == "hf_sharded":
        return write_hf(out, cfg, weights, shards=3)
    if fmt == "hf_fp8":
        return write_fp8(out, cfg, weights)[0]
    if reference is None:
        from tests.support.deepseek_reference import reference_from_weights

        reference = reference_from_weights(cfg, weights, keep_mtp=True)
    kw = {"safe_serialization": fmt == "paddlenlp_safetensors"}
    reference.save_pretrained(str(out), **kw)
    return out


def write_bf16(out: Path, cfg: dict, weights: dict[str, np.ndarray]) -> Path:
    """An HF checkpoint of `weights` rounded to bfloat16 (nearest even): what DeepSeek's fp8 → bf16
    cast script makes of the published fp8 weights."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dict(cfg, torch_dtype="bfloat16")))
    write_st_raw(out / "model.safetensors", {name: ("BF16", bf16_bits(w)) for name, w in weights.items()})
    return out
