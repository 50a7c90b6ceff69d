"""The original tool's static inference models (what `download_model` fetches) → HF-named float32 weights.

Such a directory is config.json + tokenizer files + one `rank_<i>/` per tensor-parallel rank holding
`model.json`/`model.pdmodel` and `model.pdiparams` (export/static_files.py reads them), made by
PaddleNLP's inference model classes (`paddlenlp/experimental/transformers/`): each decoder layer's
weights are fused parameters named `fuse<model>.<layer>.<what>` (q|k|v, gate|up concatenated per
rank), unquantised in the model's dtype or weight-only int8/int4 as `paddle.nn.quant.weight_quantize`
laid them out (export/weight_layout.py), with the rank's Megatron shard of every tensor.

This module is the part every family shares: the config (architecture, refused quantisations, the
keys that describe the static set-up), the rank folders, and the check of what the family's
`static_to_hf` (e.g. export/llama/static.py) took through `StaticParams` (export/static_params.py):
a fused layer parameter (`fuse…`) it left is an error (activation scales, shift/smooth terms: part of
what the original computes, so not droppable); others are ignored (the static KV-cache scales: ours
are calibrated at export).  The weights come out dequantised, exactly: `spmd_serve export --quant
source` then re-quantises them to the same integers and scales (per-channel int8; see
docs/architecture.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.family import ArchConfig, ModelFamily
from spmd_serve.export.static_files import static_rank_dirs
from spmd_serve.export.static_params import StaticParams

WEIGHT_ONLY = {"weight_only_int8": 8, "weight_only_int4": 4}
# config.json keys that describe the static form (its serving set-up), not the model: not carried over
STATIC_KEYS = (
    "quant_type",
    "weightonly_group_size",
    "tensor_parallel_degree",
    "tensor_parallel_rank",
    "tensor_parallel_output",
    "cachekv_int8_type",
    "block_size",
    "max_seq_len",
    "append_attn",
    "block_attn",
)
_IGNORED = re.compile(r"\.cache_[kv](_out)?_scale$")  # the static int8-KV scales: ours are calibrated at export


def static_config(ckpt: Path) -> dict:
    """config.json of a static model, as the architecture it computes (PaddleNLP's inference class
    names map to their HF architecture: LlamaForCausalLMBlockInferenceModel → LlamaForCausalLM); a
    quant_type with no weight-only equivalent refused."""
    path = next((p for p in (ckpt / "config.json", ckpt / "rank_0" / "config.json") if p.is_file()), None)
    if path is None:
        raise CheckpointError(f"{ckpt} has no config.json (a static inference model comes with one)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is unreadable: {e}") from None
    quant = cfg.get("quant_type") or None
    if quant is not None and quant not in WEIGHT_ONLY:
        raise CheckpointError(
            f"config.json quant_type={quant!r}: only unquantised and weight-only (weight_only_int8, "
            "weight_only_int4) static models convert; this one quantises activations or uses fp8 GEMMs, whose "
            "per-layer scales have no weight-only equivalent"
        )
    archs = [re.sub(r"(Block|Avx)?InferenceModel$", "", a) for a in cfg.get("architectures") or []]
    return dict(cfg, architectures=archs) if archs else cfg


def served_config(cfg: dict) -> dict:
    """What the served directory's config.json keeps of a static model's: the model, not its set-up."""
    return {k: v for k, v in cfg.items() if k not in STATIC_KEYS}


def _rank_dirs(ckpt: Path, cfg: dict) -> list[Path]:
    ranks = static_rank_dirs(ckpt)
    if ranks == [ckpt]:
        return ranks
    names = {p.name for p in ranks}
    missing = next((f"rank_{i}" for i in range(len(ranks)) if f"rank_{i}" not in names), None)
    if missing:
        raise CheckpointError(f"{ckpt} has no {missing}/ with a model.json/model.pdmodel and model.pdiparams")
    declared = cfg.get("tensor_parallel_degree")
    if isinstance(declared, int) and declared > len(ranks):
        raise CheckpointError(
            f"config.json says tensor_parallel_degree={declared} but {ckpt} holds {len(ranks)} rank folder(s): "
            "a multi-node model's other half (node2) is elsewhere; put every rank_<i>/ in one directory"
        )
    return ranks


def load_static(
    ckpt: Path, cfg: dict, family: ModelFamily[Any], mc: ArchConfig
) -> tuple[Mapping[str, np.ndarray], dict[str, Any]]:
    """(float32 HF-named weights, what was read: format, files, quantisation, weight layout, tp) of the
    static inference model in `ckpt` whose `static_config` is `cfg`, by `family`'s mapping."""
    ranks = _rank_dirs(ckpt, cfg)
    params = StaticParams(ranks)
    weights = family.static_to_hf(params, mc)
    leftover = [(r, n) for r, n in params.unused() if n.startswith("fuse") and not _IGNORED.search(n)]
    if leftover:
        r, n = leftover[0]
        raise CheckpointError(
            f"{params.where[r]}: {n} is not a parameter the {family.name} family's conversion knows "
            f"({len(leftover)} such): a computation spmd_serve does not have (activation scales, shift/smooth), "
            "so the model cannot be converted"
        )
    quant = cfg.get("quant_type") or None
    found = {b: q for q, b in WEIGHT_ONLY.items() if b in params.bits}
    if (quant and set(found) != {WEIGHT_ONLY[quant]}) or len(found) > 1:
        raise CheckpointError(
            f"config.json says quant_type={quant!r} but the weights are {', '.join(found.values()) or 'unquantised'}"
        )
    source = {
        "format": "paddlenlp-static",
        "files": [f"{p.name}/model.pdiparams" if p != ckpt else "model.pdiparams" for p in ranks],
        "architecture": mc.architecture,
        "source_dtype": cfg.get("dtype") or cfg.get("torch_dtype"),
        "tp": len(ranks),
        "quant": quant or next(iter(found.values()), None),
        "quant_group": next(iter(params.groups)) if len(params.groups) == 1 else None,
        "weight_layout": params.layout,
    }
    return weights, source
