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


def max_positions(model_dir: str | Path) -> int:
    """The longest sequence a checked model directory's graphs take (config.json's
    max_position_embeddings; unlimited if it records none)."""
    model_config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return _model_int(model_config, "max_position_embeddings") or 1 << 62


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


# The files that define a tokenizer's ids (export/pipeline.py copies them from the checkpoint).
TOKENIZER_FILES = ("tokenizer.model", "sentencepiece.bpe.model", "tokenizer.json", "vocab.json", "merges.txt")


def _rank_folders(d: Path) -> int:
    return sum(1 for p in d.iterdir() if p.is_dir() and _RANK_RE.fullmatch(p.name))


def check_draft_dir(cfg: ServeConfig, model_config: dict) -> dict:
    """SPECULATE_METHOD=draft_model: the draft export (SPECULATE_MODEL_PATH) must be a served model
    directory for the same ranks, with the target's vocabulary, tokenizer and KV block size (its
    drafts are the target's token ids; its pool mirrors the target's block ids).  Returns its
    config.json; every refusal is one line naming SPECULATE_MODEL_PATH."""
    path = cfg.speculate_model_path
    if path is None:
        raise ConfigError(
            "SPECULATE_METHOD=draft_model needs SPECULATE_MODEL_PATH, the draft model's export "
            f"(e.g. `spmd_serve export --demo chat-draft --out DIR --tp {cfg.mp_num}`)"
        )
    d = Path(path)
    what = f"SPECULATE_MODEL_PATH={d}"
    if d.is_dir() and (d / "config.json").is_file() and 0 < _rank_folders(d) != cfg.mp_num:
        raise ConfigError(
            f"{what} was exported for {_rank_folders(d)} rank(s) but the target runs on MP_NUM={cfg.mp_num}: "
            f"the draft runs with the target's tensor parallelism (export it with --tp {cfg.mp_num})"
        )
    try:
        draft = check_model_dir(replace(cfg, model_dir=str(d)), cfg.mp_num)
    except ConfigError as e:
        raise ConfigError(f"{what} is not a draft model export: {e}") from None
    if draft.get("vocab_size") != model_config.get("vocab_size"):
        raise ConfigError(
            f"{what}: the draft's vocab_size {draft.get('vocab_size')} differs from the target's "
            f"{model_config.get('vocab_size')} (a draft must use the target's tokenizer)"
        )
    target_dir = Path(str(cfg.model_dir))
    for name in TOKENIZER_FILES:
        mine, theirs = d / name, target_dir / name
        if mine.is_file() != theirs.is_file() or (mine.is_file() and mine.read_bytes() != theirs.read_bytes()):
            raise ConfigError(
                f"{what}: the draft's tokenizer differs from the target's ({name}); use a draft of the same tokenizer"
            )
    block_size = _model_int(draft, "block_size")
    if block_size is not None and block_size != cfg.block_size:
        raise ConfigError(
            f"{what}: the draft was exported for KV blocks of {block_size} tokens, the target serves "
            f"{cfg.block_size} (its pool mirrors the target's blocks)"
        )
    return draft
