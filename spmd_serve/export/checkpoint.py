"""Reading what users have: a checkpoint directory → (config.json, weights in HF names and layout).

Which tensors a checkpoint must hold and how PaddleNLP names them is the architecture family's
business (export/family.py); reading the files is the same for every family.

Accepted (CONTRACT §1 `spmd_serve export`):
* HuggingFace format: `model.safetensors`, or shards listed in `model.safetensors.index.json`;
  tensor names `model.…`/`lm_head.weight`, linear weights [out, in]; F32, F16 and BF16 tensors, and
  the published DeepSeek-V3/R1 fp8 layout: F8_E4M3 weights with a `<name>_scale_inv` per block of
  `quantization_config.weight_block_size` (128 x 128), dequantised here to float32.  Tensors are
  read from their file when used (export/lazy.py), never all at once.
* PaddleNLP format (what `save_pretrained` writes in 3.0.0b4): `model_state.pdparams` (or shards
  listed in `model_state.pdparams.index.json`) or PaddleNLP safetensors (`model.safetensors`, same
  index convention); tensor names `llama.…`/`qwen2.…`, linear weights and an untied `lm_head`
  stored [in, out] (Paddle's Linear layout).  They are renamed and transposed to HF's.  A pdparams
  file is Paddle's pickle, read without running it (export/pdparams.py), its arrays when used too.
* The original tool's static inference models (`rank_<i>/model.json|model.pdmodel + model.pdiparams`,
  what `download_model` fetches): converted by export/static_model.py.
Refused, with the reason: a directory `spmd_serve export` wrote itself, unsupported architectures,
missing tensors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.families import parse_model_config
from spmd_serve.export.family import ArchConfig, ModelFamily
from spmd_serve.export.lazy import LazyMap, Thunk, lazy_view, merged, shape_of, thunk_of
from spmd_serve.export.pdparams import read_pdparams
from spmd_serve.export.static_files import is_static_export
from spmd_serve.export.static_model import load_static, served_config, static_config
from spmd_serve.export.weight_files import read_safetensors


def read_config(ckpt: Path) -> dict:
    """The checkpoint's config.json; CheckpointError for what cannot be exported from (with the reason)."""
    cfg_path = ckpt / "config.json"
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt} is not a directory")
    if not cfg_path.is_file():
        raise CheckpointError(f"{ckpt} has no config.json (expected a HuggingFace or PaddleNLP checkpoint directory)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg_path} is unreadable: {e}") from None
    if "spmd_serve" in cfg:
        raise CheckpointError(
            f"{ckpt} is already a served directory written by `spmd_serve export`; "
            "export from the original checkpoint instead"
        )
    return cfg


def _dequantized(q: Thunk, scale: Thunk, block: tuple[int, int]) -> np.ndarray:
    arr, sc = q(), scale()
    full = np.repeat(np.repeat(sc, block[0], axis=0), block[1], axis=1)[: arr.shape[0], : arr.shape[1]]
    return (arr * full).astype(np.float32)


def dequantize_fp8_blocks(weights: Mapping[str, np.ndarray], block: tuple[int, int]) -> LazyMap:
    """Every `X` with an `X_scale_inv` [ceil(out/bo), ceil(in/bi)] becomes X * its block's scale
    (the published fp8 layout), when read; the scale tensors are dropped."""
    out = LazyMap()
    for name in weights:
        if name.endswith("_scale_inv"):
            continue
        if name + "_scale_inv" in weights:
            scale = thunk_of(weights, name + "_scale_inv")
            out.put(name, _dequantized, thunk_of(weights, name), scale, block, shape=shape_of(weights, name))
        else:
            out.take(name, weights)
    return out


def _weight_files(ckpt: Path) -> list[Path]:
    for index in ("model.safetensors.index.json", "model_state.pdparams.index.json"):
        if (ckpt / index).is_file():
            weight_map = json.loads((ckpt / index).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (ckpt / f).is_file()]
            if missing:
                raise CheckpointError(f"{index} lists {missing[0]}, which is not in {ckpt} (incomplete download?)")
            return [ckpt / f for f in files]
    for pattern in ("*.safetensors", "model_state.pdparams"):
        files = sorted(ckpt.glob(pattern))
        if files:
            return files
    other = sorted(str(p.relative_to(ckpt)) for p in ckpt.glob("**/*.pdiparams"))
    if other:  # e.g. PaddleNLP's own static exporter (inference.*): not the layout download_model fetches
        raise CheckpointError(
            f"{ckpt} holds Paddle inference files ({other[0]}) but not the original tool's static layout "
            "(rank_<i>/model.json or model.pdmodel, and model.pdiparams) nor checkpoint weights; export from "
            "the checkpoint they were made from"
        )
    raise CheckpointError(
        f"{ckpt} has no weights (model.safetensors, model.safetensors.index.json, "
        "model_state.pdparams or model_state.pdparams.index.json)"
    )


def load_checkpoint(ckpt: Path) -> tuple[dict, ArchConfig, Mapping[str, np.ndarray], dict]:
    """(config.json, its family's parsed config, float32 weights in HF names/layout, what was read).
    The weights of safetensors files are read when used (export/lazy.py), each time."""
    ckpt = Path(ckpt)
    if is_static_export(ckpt):
        static_cfg = static_config(ckpt)
        cfg = served_config(static_cfg)
        family, mc = parse_model_config(cfg)
        weights, source = load_static(ckpt, static_cfg, family, mc)
        return cfg, mc, _checked(ckpt, family, mc, weights), source
    cfg = read_config(ckpt)
    family, mc = parse_model_config(cfg)
    files = _weight_files(ckpt)
    bf16 = "bfloat16" in (cfg.get("dtype"), cfg.get("torch_dtype"))
    raw: Mapping[str, np.ndarray] = merged(
        *(read_safetensors(f, bf16) if f.suffix == ".safetensors" else read_pdparams(f) for f in files)
    )
    if any(k.endswith("_scale_inv") for k in raw):
        block = (cfg.get("quantization_config") or {}).get("weight_block_size", [128, 128])
        raw = dequantize_fp8_blocks(raw, (int(block[0]), int(block[1])))
    hf, fmt = family.to_hf_layout(raw, mc)
    source = {
        "format": fmt,
        "files": [f.name for f in files],
        "architecture": mc.architecture,
        "source_dtype": cfg.get("torch_dtype") or cfg.get("dtype"),
    }
    return cfg, mc, _checked(ckpt, family, mc, hf), source


def _checked(ckpt: Path, family: ModelFamily[Any], mc: ArchConfig, weights: Mapping[str, np.ndarray]) -> LazyMap:
    """The tensors the family serves (names and shapes checked against config.json) and its extras."""
    want = family.expected_tensors(mc)
    missing = [k for k in want if k not in weights]
    if missing:
        raise CheckpointError(f"{ckpt}: {len(missing)} tensor(s) missing for {mc.architecture}, e.g. {missing[0]}")
    for k, shape in want.items():
        if shape_of(weights, k) != shape:
            raise CheckpointError(
                f"{ckpt}: {k} has shape {list(shape_of(weights, k))}, config.json implies {list(shape)}"
            )
    return merged(lazy_view(weights, want), family.extra_tensors(mc, weights))
