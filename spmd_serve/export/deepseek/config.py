"""The DeepSeek family's config: DeepSeek-V2 (incl. Lite) and V3/R1 as one dataclass.

`DeepseekConfig.from_hf` reads every field the reference model (PaddleNLP's / DeepSeek's
`modeling_deepseek.py`) reads and refuses, in one line, what the stages cannot compute.  YaRN rope
scaling is computed here at export: `inv_freq` (rope dim / 2, fp32, in PaddleNLP's order of
operations), the cos/sin multiplier and the softmax scale, both folded into the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spmd_serve.export.errors import UnsupportedModel

ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
MODEL_TYPES = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
SCORING = ("softmax", "sigmoid")


def yarn_get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class MtpDraft:
    """What makes a one-layer config its target's MTP draft: the target's layer `layer`, read with
    `convention`'s rules ("paddlenlp" or "huggingface": export/deepseek/weights.mtp_convention)."""

    layer: int
    convention: str


@dataclass(frozen=True)
class DeepseekConfig:
    architecture: str
    hidden: int
    num_layers: int
    heads: int
    vocab: int
    intermediate: int  # the dense layers' MLP
    rms_norm_eps: float
    rope_theta: float
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int | None
    n_shared_experts: int | None
    num_experts_per_tok: int
    moe_intermediate: int
    first_k_dense_replace: int
    moe_layer_freq: int
    n_group: int
    topk_group: int
    topk_method: str
    scoring_func: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    rope_scaling: dict | None  # YaRN: {"type": "yarn", "factor", "original_max_position_embeddings", ...}
    num_nextn_predict_layers: int = 0
    # the head's second output for an MTP draft (HeadStage.hidden_out): set from the checkpoint's
    # MTP convention by the family's rank_weights (export/deepseek/mtp.py), None without MTP layers
    hidden_out: str | None = None
    mtp_draft: MtpDraft | None = None  # this config is the MTP draft of a target (export/deepseek/mtp.py)

    @classmethod
    def from_hf(cls, cfg: dict, architecture: str) -> DeepseekConfig:
        """Read a HuggingFace or PaddleNLP config.json; UnsupportedModel for what the stages cannot compute."""
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModel(f"hidden_act={act!r} is not supported (SwiGLU with silu only)")
        if cfg.get("attention_bias"):
            raise UnsupportedModel("attention_bias=true is not supported (DeepSeek's projections have no biases)")
        if cfg.get("tie_word_embeddings"):
            raise UnsupportedModel("tie_word_embeddings=true is not supported (DeepSeek's lm_head is its own)")
        experts = cfg.get("n_routed_experts")
        method = cfg.get("topk_method", "greedy")
        scoring = cfg.get("scoring_func", "softmax")
        if experts is not None:
            if method not in TOPK_METHODS:
                raise UnsupportedModel(f"topk_method={method!r} is not supported; supported: {', '.join(TOPK_METHODS)}")
            if scoring not in SCORING:
                raise UnsupportedModel(f"scoring_func={scoring!r} is not supported; supported: {', '.join(SCORING)}")
            groups = cfg.get("n_group") or 1
            if method != "greedy" and (experts % groups or not 0 < (cfg.get("topk_group") or 1) <= groups):
                raise UnsupportedModel(
                    f"n_routed_experts={experts}, n_group={groups}, topk_group={cfg.get('topk_group')}: "
                    "the groups must split the experts evenly and topk_group be in 1..n_group"
                )
            if method == "noaux_tc" and experts // groups < 2:
                raise UnsupportedModel("noaux_tc scores each group by its top-2 experts: a group needs >= 2")
        scaling = cfg.get("rope_scaling") or None
        if scaling is not None:
            kind = scaling.get("type", scaling.get("rope_type"))
            if kind != "yarn":
                raise UnsupportedModel(f"rope_scaling type {kind!r} is not supported; supported: yarn")
            scaling = dict(scaling, type="yarn")
        if cfg["qk_rope_head_dim"] % 2:
            raise UnsupportedModel(f"qk_rope_head_dim={cfg['qk_rope_head_dim']} must be even")
        return cls(
            architecture=architecture,
            hidden=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            heads=cfg["num_attention_heads"],
            vocab=cfg["vocab_size"],
            intermediate=cfg["intermediate_size"],
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"],
            n_routed_experts=experts,
            n_shared_experts=cfg.get("n_shared_experts"),
            num_experts_per_tok=cfg.get("num_experts_per_tok") or 1,
            moe_intermediate=cfg.get("moe_intermediate_size", 0),
            first_k_dense_replace=cfg.get("first_k_dense_replace", 0),
            moe_layer_freq=cfg.get("moe_layer_freq", 1),
            n_group=cfg.get("n_group") or 1,
            topk_group=cfg.get("topk_group") or 1,
            topk_method=method,
            scoring_func=scoring,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            rope_scaling=scaling,
            num_nextn_predict_layers=cfg.get("num_nextn_predict_layers", 0) or 0,
        )

    def is_moe(self, layer: int) -> bool:
        """DeepseekV2DecoderLayer's choice: routed experts from first_k_dense_replace on, every moe_layer_freq."""
        return (
            self.n_routed_experts is not None
            and layer >= self.first_k_dense_replace
            and layer % self.moe_layer_freq == 0
        )

    @property
    def q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def shared_intermediate(self) -> int:
        return self.moe_intermediate * (self.n_shared_experts or 0)

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies [qk_rope_head_dim / 2], float32, YaRN applied
        (DeepseekV2YarnRotaryEmbedding's arithmetic, in float32 like PaddleNLP)."""
        d, base = self.qk_rope_head_dim, np.float32(self.rope_theta)
        ar = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
        extra = (np.float32(1.0) / base**ar).astype(np.float32)
        s = self.rope_scaling
        if s is None:
            return extra
        factor = np.float32(s["factor"])
        inter = (np.float32(1.0) / (factor * base**ar)).astype(np.float32)
        orig = s["original_max_position_embeddings"]

        def corr_dim(rot: float) -> float:
            return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(self.rope_theta))

        low = max(math.floor(corr_dim(s.get("beta_fast", 32))), 0)
        high: float = min(math.ceil(corr_dim(s.get("beta_slow", 1))), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
        mask = np.float32(1.0) - ramp
        return (inter * (1 - mask) + extra * mask).astype(np.float32)

    def rope_mscale(self) -> float:
        """YaRN's multiplier of cos and sin (1 without scaling); folded into the rope weight columns."""
        s = self.rope_scaling
        if s is None:
            return 1.0
        f = s["factor"]
        return yarn_get_mscale(f, s.get("mscale", 1)) / yarn_get_mscale(f, s.get("mscale_all_dim", 0))

    def softmax_scale(self) -> float:
        """q_head_dim^-0.5, times mscale(mscale_all_dim)^2 with YaRN; folded into the query weights."""
        scale = self.q_head_dim**-0.5
        s = self.rope_scaling
        if s is not None and s.get("mscale_all_dim", 0):
            scale *= yarn_get_mscale(s["factor"], s["mscale_all_dim"]) ** 2
        return scale
