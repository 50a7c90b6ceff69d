"""The registry of architecture families, and picking one from a checkpoint's config.json.

A new family is a package defining a `ModelFamily` (export/family.py) and one entry in `FAMILIES`.
"""

from __future__ import annotations

from typing import Any

from spmd_serve.export.deepseek import DEEPSEEK
from spmd_serve.export.errors import UnsupportedModel
from spmd_serve.export.family import ArchConfig, ModelFamily
from spmd_serve.export.llama import LLAMA

FAMILIES: tuple[ModelFamily[Any], ...] = (LLAMA, DEEPSEEK)
BY_ARCHITECTURE: dict[str, ModelFamily[Any]] = {arch: f for f in FAMILIES for arch in f.architectures}
SUPPORTED_ARCHS: tuple[str, ...] = tuple(BY_ARCHITECTURE)


def architecture_of(cfg: dict[str, Any]) -> str:
    """config.json's architecture: `architectures[0]`, else the one its `model_type` names."""
    model_type = cfg.get("model_type", "llama")
    by_type = {t: arch for f in FAMILIES for t, arch in f.model_types.items()}
    return str((cfg.get("architectures") or [by_type.get(model_type, model_type)])[0])


def family_of(architecture: str) -> ModelFamily[Any]:
    family = BY_ARCHITECTURE.get(architecture)
    if family is None:
        raise UnsupportedModel(
            f"architecture {architecture!r} is not supported; supported: {', '.join(SUPPORTED_ARCHS)}"
        )
    return family


def parse_model_config(cfg: dict[str, Any]) -> tuple[ModelFamily[Any], ArchConfig]:
    """(family, its parsed config) of a checkpoint's config.json; UnsupportedModel in one line."""
    arch = architecture_of(cfg)
    family = family_of(arch)
    return family, family.parse_config(cfg, arch)
