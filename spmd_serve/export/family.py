"""Architecture families: everything `spmd_serve export` knows about one kind of model.

A family owns its config parsing (refusing, in one line, what its stages cannot compute), its tensor
names (HuggingFace and PaddleNLP), the tensor-parallel split and quantisation of its weights, its KV
cache layout and the stages its graphs are made of.  The rest of the export (checkpoint reading,
segment composition, tracing, int8-KV calibration, the manifest) is the same for every family.
Adding one is a new package defining a `ModelFamily` and one entry in export/families.py; nothing
else branches on the architecture.  Llama 2/3 and Qwen2/2.5 are one family with options
(export/llama/); DeepSeek-V2/V3 (MLA attention, MoE) another (export/deepseek/).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import QuantRecord, ShardDims

if TYPE_CHECKING:
    from spmd_serve.export.static_params import StaticParams


class ArchConfig(Protocol):
    """What the generic export reads of a family's parsed config (read-only: configs are frozen)."""

    @property
    def architecture(self) -> str: ...

    @property
    def vocab(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    def inv_freq(self) -> np.ndarray: ...


C = TypeVar("C", bound=ArchConfig)


@dataclass(frozen=True)
class Companion:
    """A model exported beside the target (`ModelFamily.companions`): `folder` under the target's
    directory, holding its own rank folders and a config.json made of `hf_config` and the usual
    `spmd_serve` key (its family's `served_options` included)."""

    folder: str
    family: ModelFamily[Any]
    config: ArchConfig
    weights: Mapping[str, np.ndarray]
    hf_config: dict[str, Any]


class ModelFamily(ABC, Generic[C]):
    """One architecture family, over its parsed config type `C`.  `architectures`: the HF
    `architectures` names it serves; `model_types`: config.json `model_type` → architecture, for
    configs without `architectures`."""

    name: str
    architectures: tuple[str, ...]
    model_types: Mapping[str, str]
    kv_int8: bool = True  # whether its exports carry the int8-KV graphs and scales (USE_CACHE_KV_INT8)
    # whether its attention segments are also traced as decode graphs (export/variant.py): for an
    # attention with a C++ op for single-token queries only
    decode_graphs: bool = False

    @abstractmethod
    def parse_config(self, cfg: dict, architecture: str) -> C:
        """config.json → the family's config; UnsupportedModel for what its stages cannot compute."""

    @abstractmethod
    def to_hf_layout(self, weights: Mapping[str, np.ndarray], mc: C) -> tuple[Mapping[str, np.ndarray], str]:
        """Checkpoint tensors → HF names and layout; returns (weights, "huggingface" | "paddlenlp")."""

    @abstractmethod
    def expected_tensors(self, mc: C) -> dict[str, tuple[int, ...]]:
        """HF tensor name → shape that a checkpoint of `mc` must provide."""

    def static_to_hf(self, params: StaticParams, mc: C) -> Mapping[str, np.ndarray]:
        """The original tool's static inference model (export/static_params.py: its fused per-rank
        parameters, taken by name) → HF names and layout, float32; refused unless the family maps them."""
        raise CheckpointError(
            f"{mc.architecture}: the original tool's static inference models of the {self.name} family cannot be "
            "converted yet; export from the checkpoint they were made from"
        )

    def extra_tensors(self, mc: C, hf: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Checkpoint tensors exported besides the served ones (e.g. DeepSeek's MTP layers), checked
        and kept by the checkpoint reader; none by default."""
        return {}

    def companions(self, mc: C, hf: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> list[Companion]:
        """Exports written beside the target's, each in its own folder at the same tp, quantisation
        and graph ops (e.g. DeepSeek's MTP layer as a draft model); none by default."""
        return []

    @abstractmethod
    def shard_dims(self, mc: C, tp: int) -> ShardDims:
        """Per-rank sizes at `tp` ranks; ShardingError when the model does not split that way."""

    @abstractmethod
    def kv_layout(self, mc: C, dims: ShardDims) -> KVLayout:
        """What one rank's KV pool holds per token and layer."""

    @abstractmethod
    def rank_weights(
        self, mc: C, hf: Mapping[str, np.ndarray], dims: ShardDims, rank: int, quant: str | None, group: int | None
    ) -> Mapping[str, Any]:
        """This rank's weights as its stages take them (quantised with `quant`)."""

    @abstractmethod
    def quant_group(self, mc: C, dims: ShardDims, requested: int | None) -> int:
        """The int4 group size at these dims (`requested` checked); QuantError when none fits."""

    @abstractmethod
    def quant_record(self, method: str | None, group: int | None) -> QuantRecord | None:
        """What the manifest and config.json record about the quantisation."""

    @abstractmethod
    def rank_kv_scales(
        self, mc: C, dims: ShardDims, rank: int, scales: Mapping[str, np.ndarray]
    ) -> dict[str, list[list[float]]]:
        """This rank's share of the calibrated int8 KV scales ([num_layers, *scale_shape] each, at tp = 1)."""

    @abstractmethod
    def build_stages(self, weights: Mapping[str, Any], dims: ShardDims, rank: int) -> list:
        """The rank's stages (export/segment.py `Stage`s), in order; imports Paddle."""

    def iter_stages(self, weights: Mapping[str, Any], dims: ShardDims, rank: int) -> Iterator[Any]:
        """build_stages's stages one at a time, each built when it is reached where the family can
        (the int8-KV calibration runs them so, holding one stage's parameters); by default all first."""
        yield from self.build_stages(weights, dims, rank)

    @abstractmethod
    def served_options(self, mc: C) -> dict[str, Any]:
        """Architecture options recorded in config.json's `spmd_serve` key."""
