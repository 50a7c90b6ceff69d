"""The Llama family: Llama 2/3 (Llama-3.1 rope scaling) and Qwen2/2.5 (q/k/v biases, tied or untied
embeddings) as options of one decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP).

config.py parses and refuses, weights.py names tensors (static.py: those of the original tool's
static inference models), sharding.py splits them over the ranks, quant.py quantises a shard,
attention.py and stages.py make the graph stages (Paddle, imported only when a graph is built).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from spmd_serve.export.family import ModelFamily
from spmd_serve.export.lazy import lazy_view
from spmd_serve.export.llama import quant, sharding, static, weights
from spmd_serve.export.llama.config import ARCHITECTURES, MODEL_TYPES, ModelConfig
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import QuantRecord, ShardDims

if TYPE_CHECKING:
    from spmd_serve.export.static_params import StaticParams


class LlamaFamily(ModelFamily[ModelConfig]):
    name = "llama"
    architectures = tuple(ARCHITECTURES)
    model_types = MODEL_TYPES

    def parse_config(self, cfg: dict, architecture: str) -> ModelConfig:
        return ModelConfig.from_hf(cfg)

    def to_hf_layout(self, w: Mapping[str, np.ndarray], mc: ModelConfig) -> tuple[Mapping[str, np.ndarray], str]:
        return weights.to_hf_layout(w, mc)

    def static_to_hf(self, params: StaticParams, mc: ModelConfig) -> Mapping[str, np.ndarray]:
        return static.static_to_hf(params, mc)

    def expected_tensors(self, mc: ModelConfig) -> dict[str, tuple[int, ...]]:
        return weights.expected_tensors(mc)

    def shard_dims(self, mc: ModelConfig, tp: int) -> ShardDims:
        return sharding.shard_dims(mc, tp)

    def kv_layout(self, mc: ModelConfig, dims: ShardDims) -> KVLayout:
        return sharding.kv_layout(dims)

    def rank_weights(
        self,
        mc: ModelConfig,
        hf: Mapping[str, np.ndarray],
        dims: ShardDims,
        rank: int,
        method: str | None,
        group: int | None,
    ) -> Mapping[str, Any]:
        shard = sharding.shard_weights(hf, mc, dims, rank)
        if method:
            shard = quant.quantize_shard(shard, hf, mc, dims, rank, method, group)
        return lazy_view(shard, inv_freq=mc.inv_freq().astype(np.float32))  # RoPE's, for the paged attention op

    def quant_group(self, mc: ModelConfig, dims: ShardDims, requested: int | None) -> int:
        return quant.quant_group(dims, requested)

    def quant_record(self, method: str | None, group: int | None) -> QuantRecord | None:
        return quant.quant_record(method, group)

    def rank_kv_scales(
        self, mc: ModelConfig, dims: ShardDims, rank: int, scales: Mapping[str, np.ndarray]
    ) -> dict[str, list[list[float]]]:
        heads = sharding.kv_heads_of_rank(mc, dims, rank)  # scales are [num_layers, kv_heads]
        return {name: sc[:, heads].tolist() for name, sc in scales.items()}

    def build_stages(self, w: Mapping[str, Any], dims: ShardDims, rank: int) -> list:
        return list(self.iter_stages(w, dims, rank))

    def iter_stages(self, w: Mapping[str, Any], dims: ShardDims, rank: int) -> Iterator[Any]:
        from spmd_serve.export.llama.attention import AttentionStage
        from spmd_serve.export.llama.stages import EmbedStage, HeadStage, MlpStage

        yield EmbedStage(w, dims, rank)
        for layer in range(dims.num_layers):
            yield AttentionStage(w, dims, layer)
            yield MlpStage(w, dims, layer)
        yield HeadStage(w, dims)

    def served_options(self, mc: ModelConfig) -> dict[str, Any]:
        return {
            "rope_scaling": mc.rope_scaling,
            "attention_bias": mc.attention_bias,
            "tie_word_embeddings": mc.tie_word_embeddings,
        }


LLAMA = LlamaFamily()
