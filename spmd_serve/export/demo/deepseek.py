"""The DeepSeek demo presets.  `deepseek-tiny`: a random-weight DeepSeek-V3-shaped checkpoint (MLA
with q_lora_rank, noaux_tc routing over 8 experts in 4 groups with sigmoid scores and a correction
bias, one shared expert, a dense first layer, YaRN, one MTP layer) for the demo tokenizer, so the
family runs offline, in tests and in `spmd_serve bench`.  `chat-deepseek`: the same attention and
MTP layer on dense layers, trained on the chat demo's data (train.py; weights committed in
trained/deepseek/), so the `mtp` proposer's drafts can be measured on a model that writes text.

`make_weights(config, seed)` is also what the tests' tiny DeepSeek checkpoints are made of
(tests/support/deepseek_zoo.py): linears ~ N(0, 1/fan_in), norms 1 + small noise, the router's
logits std ~2 (few routing near-ties), the lm_head's logits std ~3 (few greedy near-ties).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PRESETS = ("deepseek-tiny", "chat-deepseek")
# chat-deepseek's changes to deepseek-tiny's shape: no routed experts (every layer, the MTP layer
# included, a dense MLP: what ~10 CPU-minutes of training can fit), 2 layers + the MTP layer,
# ~1.06 M parameters (2.1 MB in float16).
_CHAT_SHAPE = {
    "architectures": ["DeepseekV2ForCausalLM"],  # PaddleNLP's class that train.py trains
    "model_type": "deepseek_v2",
    "hidden_size": 128,
    "intermediate_size": 320,
    "num_hidden_layers": 2,
    "q_lora_rank": 64,
    "v_head_dim": 32,
    "n_routed_experts": None,
}


def make_config(preset: str, vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {PRESETS}")
    tiny = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        **ids,
        "torch_dtype": "float32",
    }
    return tiny | _CHAT_SHAPE if preset == "chat-deepseek" else tiny


def _layer(cfg: dict[str, Any], i: int, normal, moe: bool) -> dict[str, np.ndarray]:
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]

    def linear(o: int, i_: int) -> np.ndarray:
        return normal((o, i_), 1.0 / np.sqrt(i_))

    def norm(n: int) -> np.ndarray:
        return (1.0 + normal((n,), 0.05)).astype(np.float32)

    def mlp(prefix: str, inter: int) -> dict[str, np.ndarray]:
        return {
            prefix + "gate_proj.weight": linear(inter, h),
            prefix + "up_proj.weight": linear(inter, h),
            prefix + "down_proj.weight": linear(h, inter),
        }

    p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    w = {p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h)}
    if cfg["q_lora_rank"] is None:
        w[a + "q_proj.weight"] = linear(nh * (dn + dr), h)
    else:
        qr = cfg["q_lora_rank"]
        w[a + "q_a_proj.weight"], w[a + "q_a_layernorm.weight"] = linear(qr, h), norm(qr)
        w[a + "q_b_proj.weight"] = linear(nh * (dn + dr), qr)
    w[a + "kv_a_proj_with_mqa.weight"], w[a + "kv_a_layernorm.weight"] = linear(kvr + dr, h), norm(kvr)
    w[a + "kv_b_proj.weight"] = linear(nh * (dn + dv), kvr)
    w[a + "o_proj.weight"] = linear(h, nh * dv)
    if not moe:
        return w | mlp(m, cfg["intermediate_size"])
    e = cfg["n_routed_experts"]
    w[m + "gate.weight"] = normal((e, h), 2.0 / np.sqrt(h))
    if cfg["topk_method"] == "noaux_tc":
        w[m + "gate.e_score_correction_bias"] = normal((e,), 0.05)
    for x in range(e):
        w |= mlp(f"{m}experts.{x}.", cfg["moe_intermediate_size"])
    if cfg.get("n_shared_experts"):
        w |= mlp(m + "shared_experts.", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
    return w


def is_moe_layer(cfg: dict[str, Any], i: int) -> bool:
    return (
        cfg.get("n_routed_experts") is not None and i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0
    )


def make_weights(cfg: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights of a DeepSeek config, its MTP layers (`model.layers.<L + j>.*`) included."""
    rng = np.random.default_rng(seed)
    h, vocab, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    w = {"model.embed_tokens.weight": normal((vocab, h), 1.0)}
    for i in range(n):
        w |= _layer(cfg, i, normal, is_moe_layer(cfg, i))
    for j in range(cfg.get("num_nextn_predict_layers", 0)):  # MTP: a MoE decoder layer + its own parts
        p = f"model.layers.{n + j}."
        w |= _layer(cfg, n + j, normal, True)
        w |= {
            p + "embed_tokens.weight": w["model.embed_tokens.weight"],
            p + "enorm.weight": 1.0 + normal((h,), 0.05),
            p + "hnorm.weight": 1.0 + normal((h,), 0.05),
            p + "eh_proj.weight": normal((h, 2 * h), 1.0 / np.sqrt(2 * h)),
            p + "shared_head.norm.weight": 1.0 + normal((h,), 0.05),
            p + "shared_head.head.weight": normal((vocab, h), 3.0 / np.sqrt(h)),
        }
    w["model.norm.weight"] = (1.0 + normal((h,), 0.05)).astype(np.float32)
    w["lm_head.weight"] = normal((vocab, h), 3.0 / np.sqrt(h))
    return w
