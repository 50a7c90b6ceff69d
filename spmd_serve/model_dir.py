"""Start-up checks of the served model directory (CONTRACT §7) against the configuration, and fitting
the configuration to the model (MAX_SEQ_LEN, BLOCK_SIZE).

Every rank runs them on the same inputs before loading anything, so a bad directory stops all ranks
with the same one-line `ConfigError`.  What the export recorded inside the directory is checked by
worker/capacity.py (config.json's `spmd_serve` key) and manifest.py (each rank's manifest).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from spmd_serve.config import ConfigError, ServeConfig

_RANK_RE = re.compile(r"rank_(\d+)")


def check_model_dir(cfg: ServeConfig, world_size: int) -> dict:
    """Validate the served model directory (CONTRACT §7) and return its parsed config.json."""
    n = cfg.mp_num
    if n % cfg.mp_nnode:
        raise ConfigError(f"MP_NUM={n} is invalid: must be a multiple of MP_NNODE={cfg.mp_nnode}")
    if n != world_size:
        raise ConfigError(f"MP_NUM={n} but the MPI world size is {world_size} (start with mpirun -n {n})")
    if cfg.model_dir is None:
        raise ConfigError("MODEL_DIR is not set (no model directory to check)")
    d = Path(cfg.model_dir)
    if not d.exists():
        raise ConfigError(f"MODEL_DIR={d} does not exist")
    if not d.is_dir():
        raise ConfigError(f"MODEL_DIR={d} is not a directory")
    hint = "not a served model directory? create one with `spmd_serve export`"
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"model directory {d} has no config.json ({hint})")
    try:
        model_config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"model directory {d}: cannot read config.json ({e})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"model directory {d}: config.json is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(model_config, dict):
        raise ConfigError(f"model directory {d}: config.json must hold a JSON object")
    ranks = sorted(int(m.group(1)) for p in d.iterdir() if p.is_dir() and (m := _RANK_RE.fullmatch(p.name)))
    if not ranks:
        raise ConfigError(f"model directory {d} has no rank_0/ ({hint})")
    for i in range(n):
        if i not in ranks:
            raise ConfigError(
                f"model directory {d} has no rank_{i}/ (it has {len(ranks)} rank "
                f"folder(s): exported with --tp {len(ranks)}? set MP_NUM to match)"
            )
    if len(ranks) != n:
        raise ConfigError(
            f"model directory {d} has {len(ranks)} rank folders but MP_NUM={n} "
            f"(exported with --tp {len(ranks)}? set MP_NUM={len(ranks)})"
        )
    for i in range(n):
        if not any((d / f"rank_{i}").iterdir()):
            raise ConfigError(f"model directory {d} has an empty rank_{i}/ (incomplete export or download?)")
    r0 = d / "rank_0"
    static = (r0 / "model.pdiparams").is_file() and any((r0 / f).is_file() for f in ("model.json", "model.pdmodel"))
    if static and not (r0 / "manifest.json").is_file():
        raise ConfigError(
            f"model directory {d} is the original tool's static inference model: convert it once with "
            f"`spmd_serve export --checkpoint {d} --out <dir> --tp {n}` and serve <dir> (start_server does both)"
        )
    return model_config


def _model_int(model_config: dict, key: str) -> int | None:
    value = model_config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"config.json: {key}={value!r} is invalid: must be an integer >= 1")
    return value


def clamp_to_model(cfg: ServeConfig, model_config: dict) -> ServeConfig:
    """Fit the config to the model: MAX_SEQ_LEN <= max_position_embeddings; the model's block_size
    (if its config.json fixes one) replaces BLOCK_SIZE because the exported graph depends on it."""
    changes: dict[str, Any] = {}
    limit = _model_int(model_config, "max_position_embeddings")
    if limit is not None and cfg.max_seq_len > limit:
        changes["max_seq_len"] = limit
    block_size = _model_int(model_config, "block_size")
    if block_size is not None and block_size != cfg.block_size:
        changes["block_size"] = block_size
    return replace(cfg, **changes) if changes else cfg
