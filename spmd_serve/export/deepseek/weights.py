"""The DeepSeek family's tensor names: what a checkpoint must hold (HF names and shapes), the MTP
layers' tensors, and PaddleNLP's names and layout turned into HF's.

HF: `model.layers.<i>.self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}`, `kv_a_proj_with_mqa`,
`kv_a_layernorm`, `kv_b_proj`, `o_proj`; `mlp.{gate,up,down}_proj` (dense layers) or `mlp.gate`
(router [experts, hidden]), `mlp.gate.e_score_correction_bias` (noaux_tc), `mlp.experts.<e>.*`,
`mlp.shared_experts.*`; linear weights [out, in].  MTP layers are `model.layers.<L + j>.*` (a MoE
decoder layer plus `embed_tokens`, `enorm`, `hnorm`, `eh_proj`, `shared_head.{norm,head}`; whose
conventions they follow: `mtp_convention`).
PaddleNLP's `save_pretrained` (3.0.0b4) names them `deepseek_v2.…` / `deepseek_v3.…` and stores
every 2-D weight but the embeddings transposed ([in, out]; the router [hidden, experts]; the
lm_head [hidden, vocab]).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from spmd_serve.export.deepseek.config import DeepseekConfig
from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.lazy import LazyMap, is_bf16, lazy_view, shape_of, thunk_of, transposed

_PREFIXES = ("deepseek_v2.", "deepseek_v3.")


def to_hf_layout(weights: Mapping[str, np.ndarray], mc: DeepseekConfig) -> tuple[Mapping[str, np.ndarray], str]:
    """Rename / transpose PaddleNLP tensors to HF's (when read); returns (weights, 'huggingface' | 'paddlenlp')."""
    if any(k.startswith("model.") for k in weights):
        return weights, "huggingface"
    if not any(k.startswith(_PREFIXES) for k in weights):
        raise CheckpointError(
            f"unrecognised tensor names (e.g. {next(iter(weights), '?')!r}): expected "
            "HuggingFace `model.…` or PaddleNLP `deepseek_v2.…`/`deepseek_v3.…` names"
        )
    out = LazyMap()
    for name in weights:
        hf_name = name
        if name != "lm_head.weight":
            prefix = next((p for p in _PREFIXES if name.startswith(p)), None)
            if prefix is None:
                raise CheckpointError(f"unexpected tensor {name!r} in a PaddleNLP checkpoint")
            hf_name = "model." + name[len(prefix) :]
        shape = shape_of(weights, name)
        if len(shape) == 2 and not hf_name.endswith("embed_tokens.weight"):  # Paddle [in, out] → HF [out, in]
            out.put(hf_name, transposed, thunk_of(weights, name), shape=shape[::-1], bf16=is_bf16(weights, name))
        else:
            out.take(hf_name, weights, name)
    return out, "paddlenlp"


def _mlp(prefix: str, inter: int, h: int) -> dict[str, tuple[int, ...]]:
    return {
        prefix + "gate_proj.weight": (inter, h),
        prefix + "up_proj.weight": (inter, h),
        prefix + "down_proj.weight": (h, inter),
    }


def layer_tensors(mc: DeepseekConfig, i: int, moe: bool) -> dict[str, tuple[int, ...]]:
    """HF name → shape of decoder layer `i`'s tensors (attention, norms, dense MLP or MoE)."""
    h, nh, kvr, dr = mc.hidden, mc.heads, mc.kv_lora_rank, mc.qk_rope_head_dim
    p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    shapes: dict[str, tuple[int, ...]] = {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
    }
    if mc.q_lora_rank is None:
        shapes[a + "q_proj.weight"] = (nh * mc.q_head_dim, h)
    else:
        qr = mc.q_lora_rank
        shapes[a + "q_a_proj.weight"], shapes[a + "q_a_layernorm.weight"] = (qr, h), (qr,)
        shapes[a + "q_b_proj.weight"] = (nh * mc.q_head_dim, qr)
    shapes.update(
        {
            a + "kv_a_proj_with_mqa.weight": (kvr + dr, h),
            a + "kv_a_layernorm.weight": (kvr,),
            a + "kv_b_proj.weight": (nh * (mc.qk_nope_head_dim + mc.v_head_dim), kvr),
            a + "o_proj.weight": (h, nh * mc.v_head_dim),
        }
    )
    if not moe:
        return shapes | _mlp(m, mc.intermediate, h)
    e = mc.n_routed_experts or 0
    shapes[m + "gate.weight"] = (e, h)
    if mc.topk_method == "noaux_tc":
        shapes[m + "gate.e_score_correction_bias"] = (e,)
    for x in range(e):
        shapes |= _mlp(f"{m}experts.{x}.", mc.moe_intermediate, h)
    if mc.n_shared_experts:
        shapes |= _mlp(m + "shared_experts.", mc.shared_intermediate, h)
    return shapes


def expected_tensors(mc: DeepseekConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name → shape that a checkpoint of `mc` must provide (the served layers; MTP layers'
    tensors are `mtp_tensors`)."""
    h = mc.hidden
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (mc.vocab, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (mc.vocab, h),
    }
    for i in range(mc.num_layers):
        shapes |= layer_tensors(mc, i, mc.is_moe(i))
    return shapes


def mtp_tensors(mc: DeepseekConfig, weights: Mapping[str, np.ndarray]) -> LazyMap:
    """The checkpoint's MTP-layer tensors (`model.layers.<L + j>.*`, j < num_nextn_predict_layers),
    as found: HF checkpoints hold their own embed_tokens / shared_head, PaddleNLP's share the
    model's and add an eh_proj bias.  CheckpointError when a layer's decoder part is missing."""
    found: list[str] = []
    for j in range(mc.num_nextn_predict_layers):
        prefix = f"model.layers.{mc.num_layers + j}."
        need = [*layer_tensors(mc, mc.num_layers + j, mc.is_moe(mc.num_layers + j)), prefix + "eh_proj.weight"]
        missing = [k for k in need if k not in weights]
        if missing:
            raise CheckpointError(f"num_nextn_predict_layers={mc.num_nextn_predict_layers}: {missing[0]} is missing")
        found += [k for k in weights if k.startswith(prefix)]
    return lazy_view(weights, found)


MTP_FOLDER = "mtp"  # the MTP draft's export, beside the target's rank folders (export/deepseek/mtp.py)
PADDLENLP, HUGGINGFACE = "paddlenlp", "huggingface"
# the target's hidden rows an MTP layer reads, per convention (HeadStage.hidden_out)
TARGET_HIDDEN = {PADDLENLP: "pre_norm", HUGGINGFACE: "post_norm", None: None}


def mtp_convention(mc: DeepseekConfig, weights: Mapping[str, np.ndarray]) -> str | None:
    """Whose code the checkpoint's MTP layer follows; None without MTP layers.  PaddleNLP's
    `DeepseekV2MTPLayer` (its eh_proj an nn.Linear with a bias, sharing the model's embedding, final
    norm and head) reads the target's hidden rows before the final norm, eh_proj(concat(hnorm(h),
    enorm(e))); the published V3 weights (no bias, their own `shared_head`) are read as vLLM /
    SGLang do: rows after the final norm, eh_proj(concat(enorm(e), hnorm(h)))."""
    if not mc.num_nextn_predict_layers:
        return None
    return PADDLENLP if f"model.layers.{mc.num_layers}.eh_proj.bias" in weights else HUGGINGFACE


def mtp_record(mc: DeepseekConfig) -> dict | None:
    """config.json's pointer to the MTP draft export (None without MTP layers)."""
    if not mc.num_nextn_predict_layers:
        return None
    return {"folder": MTP_FOLDER, "layer": mc.num_layers, "served": True}
