"""The Llama family's parameters in the original tool's static inference models → HF names and layout.

PaddleNLP's `LlamaInferenceModel` / `Qwen2InferenceModel` (and their Block variants, which the
published models use) name and fuse them per rank r of tp (`set_state_dict` in
paddlenlp/experimental/transformers/{llama,qwen2}/modeling.py):

* `fuse<llama|qwen2>.<i>.qkv_weight`: q_r | k_r | v_r of this rank's heads, [qkv_r, H] unquantised
  (`trans_qkvw`), else weight_quantize of [H, qkv_r]; Qwen2's `qkv_bias` [qkv_r] likewise;
* `out_proj_weight` [q_r, H], `ffn1_weight` [H, 2 I_r] (gate_r | up_r), `ffn2_weight` [I_r, H] (the
  row-parallel o and down are the rank's input rows); `ln_scale`, `ffn_ln_scale` whole on every rank;
* unnamed: the embedding `embedding_<n>.w_0` (`vocab_parallel_embedding_<n>.w_0`, [V/tp, H], when
  tp > 1 divides V), the final norm `create_parameter_<n>.w_0` [H], and an untied lm_head
  `<model>lm_head_<n>.w_0` or `<model>_lm_head_<n>.w_0` ([H, V/tp] likewise); a tied Qwen2 has none
  (it multiplies by the embedding).

KV heads are split like PaddleNLP splits them (contiguous heads per rank); its inference classes
need tp to divide the KV heads, so a model where it does not is refused.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.lazy import LazyMap, as_float32, constant, transposed
from spmd_serve.export.llama.config import ModelConfig

if TYPE_CHECKING:
    from spmd_serve.export.static_params import StaticParams

PREFIXES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def _vocab_part(mc: ModelConfig, tp: int) -> int:
    """Vocab rows (embedding) / columns (lm_head) per rank: split when tp divides the vocabulary."""
    return mc.vocab // tp if tp > 1 and mc.vocab % tp == 0 else mc.vocab


def _cat(parts: list[np.ndarray], axis: int) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


def _vocab_table(p: StaticParams, names: list[str], shape: tuple[int, int], axis: int, whole: bool) -> np.ndarray:
    """The ranks' embedding ([V_r, H], axis 0) or lm_head ([H, V_r], axis 1) parts, as the model's."""
    parts = [p.tensor(r, name, shape) for r, name in enumerate(names)]
    return parts[0] if whole else _cat(parts, axis)


def _hf_linear(p: StaticParams, name: str, dims: tuple[int, int, bool], cols: slice | None, axis: int) -> np.ndarray:
    """The ranks' [k, n] linears `name` (columns `cols` of each), joined along `axis`, as HF's [out, in]."""
    parts = [p.linear(r, name, *dims) for r in range(p.tp)]
    return _cat([w if cols is None else w[:, cols] for w in parts], axis).T


def _bias(p: StaticParams, name: str, size: int, cols: slice) -> np.ndarray:
    return _cat([p.tensor(r, name, (size,))[cols] for r in range(p.tp)], 0)


def static_to_hf(p: StaticParams, mc: ModelConfig) -> LazyMap:
    """Every rank's fused parameters → the unsharded HF tensors (float32, [out, in] linears), each
    converted when read (export/lazy.py); every parameter is checked and taken here."""
    tp, h, hd, model = p.tp, mc.hidden, mc.head_dim, PREFIXES[mc.architecture]
    if mc.heads % tp or mc.kv_heads % tp or mc.intermediate % tp:
        raise CheckpointError(
            f"{tp} rank folders cannot hold a model with {mc.heads} query / {mc.kv_heads} KV heads and "
            f"intermediate_size={mc.intermediate} (PaddleNLP splits each evenly over the ranks)"
        )
    q, kv, inter, v = mc.heads // tp * hd, mc.kv_heads // tp * hd, mc.intermediate // tp, _vocab_part(mc, tp)
    ranks = range(tp)
    out = LazyMap()
    embed = [p.find(r, r"(vocab_parallel_)?embedding_\d+\.w_0", "embedding") for r in ranks]
    for r in ranks:
        p.check_tensor(r, embed[r], (v, h))
    out.put("model.embed_tokens.weight", _vocab_table, p, embed, (v, h), 0, v == mc.vocab, shape=(mc.vocab, h))
    out.put("model.norm.weight", constant, p.replicated(p.find(0, r"create_parameter_\d+\.w_0", "final norm"), (h,)))
    if not mc.tie_word_embeddings:
        heads = [p.find(r, rf"{model}_?lm_head_\d+\.w_0", "lm_head") for r in ranks]
        for r in ranks:
            p.check_tensor(r, heads[r], (h, v))
        out.put(
            "lm_head.weight", transposed, partial(_vocab_table, p, heads, (h, v), 1, v == mc.vocab), shape=(mc.vocab, h)
        )
    for i in range(mc.num_layers):
        fused, hf = f"fuse{model}.{i}.", f"model.layers.{i}."
        dims = {
            "qkv_weight": (h, q + 2 * kv, True),
            "out_proj_weight": (q, h, False),
            "ffn1_weight": (h, 2 * inter, False),
            "ffn2_weight": (inter, h, False),
        }
        for name, d in dims.items():
            for r in ranks:
                p.check_linear(r, fused + name, *d)
        cuts = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
        for name, cols in cuts.items():
            rows = (cols.stop - cols.start) * tp
            qkv = dims["qkv_weight"]
            out.put(f"{hf}self_attn.{name}.weight", _hf_linear, p, fused + "qkv_weight", qkv, cols, 1, shape=(rows, h))
        if mc.attention_bias:
            for r in ranks:
                p.check_tensor(r, fused + "qkv_bias", (q + 2 * kv,))
            for name, cols in cuts.items():
                size = (cols.stop - cols.start) * tp
                out.put(f"{hf}self_attn.{name}.bias", _bias, p, fused + "qkv_bias", q + 2 * kv, cols, shape=(size,))
        o = dims["out_proj_weight"]
        out.put(f"{hf}self_attn.o_proj.weight", _hf_linear, p, fused + "out_proj_weight", o, None, 0, shape=(h, q * tp))
        ffn1 = dims["ffn1_weight"]
        big = (inter * tp, h)
        out.put(f"{hf}mlp.gate_proj.weight", _hf_linear, p, fused + "ffn1_weight", ffn1, slice(0, inter), 1, shape=big)
        up = slice(inter, 2 * inter)
        out.put(f"{hf}mlp.up_proj.weight", _hf_linear, p, fused + "ffn1_weight", ffn1, up, 1, shape=big)
        ffn2 = dims["ffn2_weight"]
        out.put(f"{hf}mlp.down_proj.weight", _hf_linear, p, fused + "ffn2_weight", ffn2, None, 0, shape=big[::-1])
        out.put(f"{hf}input_layernorm.weight", constant, p.replicated(fused + "ln_scale", (h,)))
        out.put(f"{hf}post_attention_layernorm.weight", constant, p.replicated(fused + "ffn_ln_scale", (h,)))
    return as_float32(out)
