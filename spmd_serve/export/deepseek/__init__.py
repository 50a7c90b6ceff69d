"""The DeepSeek family: DeepSeek-V2 (incl. Lite) and V3/R1 — Multi-head Latent Attention with its
compressed cache, a Mixture of Experts with shared and routed experts (expert-parallel over the
ranks), dense first layers, YaRN rope scaling; the MTP layer exported as a draft model (mtp.py).

config.py parses and refuses, weights.py names tensors, sharding.py splits them over the ranks
and folds the absorbed MLA forms, mla.py and moe.py are the graph stages (Paddle, imported only
when a graph is built); the embedding, dense MLP and head stages are the Llama family's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from spmd_serve.export.deepseek import mtp, quant, sharding, weights
from spmd_serve.export.deepseek.config import ARCHITECTURES, MODEL_TYPES, DeepseekConfig
from spmd_serve.export.family import Companion, ModelFamily
from spmd_serve.export.lazy import lazy_view, merged
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import QuantRecord, ShardDims


class DeepseekFamily(ModelFamily[DeepseekConfig]):
    name = "deepseek"
    architectures = ARCHITECTURES
    model_types = MODEL_TYPES
    kv_int8 = False  # the MLA latent pool is fp32 only (no int8-KV graphs or scales are exported)
    decode_graphs = True  # spmd_mla_decode attends for single-token queries; chunks: batched products

    def parse_config(self, cfg: dict, architecture: str) -> DeepseekConfig:
        return DeepseekConfig.from_hf(cfg, architecture)

    def to_hf_layout(self, w: Mapping[str, np.ndarray], mc: DeepseekConfig) -> tuple[Mapping[str, np.ndarray], str]:
        return weights.to_hf_layout(w, mc)

    def expected_tensors(self, mc: DeepseekConfig) -> dict[str, tuple[int, ...]]:
        return weights.expected_tensors(mc)

    def extra_tensors(self, mc: DeepseekConfig, hf: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return weights.mtp_tensors(mc, hf)

    def companions(self, mc: DeepseekConfig, hf: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> list[Companion]:
        return mtp.companions(self, mc, hf, cfg)

    def shard_dims(self, mc: DeepseekConfig, tp: int) -> ShardDims:
        if mc.mtp_draft is not None:
            mtp.check_split(mc, tp)
        return sharding.shard_dims(mc, tp)

    def kv_layout(self, mc: DeepseekConfig, dims: ShardDims) -> KVLayout:
        return sharding.kv_layout(mc)

    def rank_weights(
        self,
        mc: DeepseekConfig,
        hf: Mapping[str, np.ndarray],
        dims: ShardDims,
        rank: int,
        method: str | None,
        group: int | None,
    ) -> Mapping[str, Any]:
        # the head's hidden rows for the MTP draft, as the checkpoint's MTP convention reads them
        hidden_out = mc.hidden_out or weights.TARGET_HIDDEN[weights.mtp_convention(mc, hf)]
        shard = lazy_view(sharding.shard_weights(hf, mc, dims, rank), config=replace(mc, hidden_out=hidden_out))
        if method:
            shard = quant.quantize_shard(shard, hf, mc, dims, rank, method, group)
        return merged(shard, mtp.input_weights(hf, mc, dims, rank) if mc.mtp_draft is not None else {})

    def quant_group(self, mc: DeepseekConfig, dims: ShardDims, requested: int | None) -> int:
        return quant.quant_group(mc, dims, requested)

    def quant_record(self, method: str | None, group: int | None) -> QuantRecord | None:
        return quant.quant_record(method, group)

    def rank_kv_scales(
        self, mc: DeepseekConfig, dims: ShardDims, rank: int, scales: Mapping[str, np.ndarray]
    ) -> dict[str, list[list[float]]]:
        raise NotImplementedError("the MLA pool has no int8 scales (kv_int8 = False)")

    def build_stages(self, w: Mapping[str, Any], dims: ShardDims, rank: int) -> list:
        from spmd_serve.export.deepseek.mla import MlaStage
        from spmd_serve.export.deepseek.moe import MoeStage
        from spmd_serve.export.llama.stages import EmbedStage, HeadStage, MlpStage

        mc: DeepseekConfig = w["config"]
        stages: list = [EmbedStage(w, dims, rank)]
        for layer in range(dims.num_layers):
            mlp = MoeStage(w, dims, layer, rank) if mc.is_moe(layer) else MlpStage(w, dims, layer)
            stages += [MlaStage(w, dims, layer), mlp]
        stages.append(HeadStage(w, dims, mc.hidden_out))
        if mc.mtp_draft is not None:  # the MTP layer's input projection after the embedding
            from spmd_serve.export.deepseek.mtp_stage import MtpInputStage

            stages.insert(1, MtpInputStage(w, dims, rank))
        return stages

    def served_options(self, mc: DeepseekConfig) -> dict[str, Any]:
        options = {
            "rope_scaling": mc.rope_scaling,
            "kv_cache": "mla_latent",
            "n_routed_experts": mc.n_routed_experts,
            "num_nextn_predict_layers": mc.num_nextn_predict_layers,
            "mtp": weights.mtp_record(mc),  # the target's pointer to its MTP draft (None in the draft)
        }
        if mc.mtp_draft is not None:
            options["mtp_draft"] = mtp.draft_record(mc.mtp_draft)
        return options


DEEPSEEK = DeepseekFamily()
