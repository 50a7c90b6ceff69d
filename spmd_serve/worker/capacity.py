"""Start-up checks of what a rank can hold and what this build can do, as one-line ConfigErrors.

BLOCK_BS sizes the KV pool (CONTRACT §2); a pool that cannot fit in memory must fail at start
with the largest value that fits, not later with an out-of-memory kill mid-request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import psutil

from spmd_serve.config import ConfigError
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import ManifestError
from spmd_serve.served_config import ServedConfig, check_dtype_runnable

MEMORY_FRACTION = 0.9  # of available memory per rank, leaving room for activations


def kv_bytes_per_block(kv: KVLayout | Mapping[str, int], block_size: int, kv_int8: bool = False) -> int:
    """Pool bytes of one block: `kv` is the manifest's layout, or Llama dims (num_layers, kv_heads,
    head_dim) for its K and V (an int8 pool's scales are per layer and head, not per block: negligible)."""
    layout = kv if isinstance(kv, KVLayout) else KVLayout.kv_heads(kv["num_layers"], kv["kv_heads"], kv["head_dim"])
    return block_size * layout.bytes_per_token(kv_int8)


def check_kv_fits(cfg, layout: KVLayout, ranks_on_node: int, draft: KVLayout | None = None, scratch: int = 0) -> None:
    """The rank's KV pool, and a draft model's (`draft`: its layout, fp32; a block per target block
    plus `scratch` blocks: engine/draft_model.draft_pool_blocks), must fit in its share of memory."""
    per_block = kv_bytes_per_block(layout, cfg.block_size, cfg.use_cache_kv_int8)
    draft_block = kv_bytes_per_block(draft, cfg.block_size) if draft is not None else 0
    per_block += draft_block
    need = per_block * cfg.num_blocks() + draft_block * scratch
    budget = psutil.virtual_memory().available * MEMORY_FRACTION / max(ranks_on_node, 1)
    if need > budget:
        blocks_per_seq = math.ceil(max(cfg.max_seq_len, cfg.max_dec_len) / cfg.block_size)
        fits = int(budget // (per_block * blocks_per_seq))
        raise ConfigError(
            f"BLOCK_BS={cfg.block_bs} needs {need / 2**30:.1f} GiB of KV cache per rank"
            f"{' (the draft model’s included)' if draft is not None else ''} but only "
            f"{budget / 2**30:.1f} GiB is available; the largest BLOCK_BS that fits is {fits}"
        )


def check_supported(cfg) -> None:
    """Refuse settings whose feature this build lacks, rather than silently ignoring them."""
    method = cfg.speculate_method
    if cfg.speculate_model_path is not None and method != "draft_model":
        raise ConfigError(
            f"SPECULATE_MODEL_PATH={cfg.speculate_model_path} has no effect unless SPECULATE_METHOD=draft_model "
            f"(it is {method})"
        )


def check_served_model(model_config: dict, model_dir: str | None = None) -> None:
    """What `spmd_serve export` recorded in config.json must be runnable by this build (CONTRACT §7);
    the error names the directory's config.json when `model_dir` is given (which export to redo)."""
    served = model_config.get("spmd_serve")
    if served is None:
        return  # not written by `spmd_serve export`: the rank folders' manifests are checked when read
    where = f"{model_dir}/config.json" if model_dir else "config.json"
    try:
        record = ServedConfig.from_json(served)
    except ManifestError as e:
        raise ConfigError(f"{where}: {e}") from None
    try:
        check_dtype_runnable(record.dtype)
    except ManifestError as e:
        raise ConfigError(f"{where}: the model was exported with dtype {record.dtype!r}: {e}") from None
