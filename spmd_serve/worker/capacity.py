"""Start-up checks of what a rank can hold and what this build can do, as one-line ConfigErrors.

BLOCK_BS sizes the KV pool (CONTRACT §2); a pool that cannot fit in memory must fail at start
with the largest value that fits, not later with an out-of-memory kill mid-request.
"""
from __future__ import annotations

import logging
import math

import psutil

from spmd_serve.config import ConfigError

log = logging.getLogger(__name__)
MEMORY_FRACTION = 0.9      # of available memory per rank, leaving room for activations


def kv_bytes_per_block(dims: dict, block_size: int, kv_int8: bool = False) -> int:
    # K and V, every layer, fp32 or int8: [block_size, kv_heads, head_dim] each (an int8 pool's
    # scales are per layer and head, not per block: negligible)
    return 2 * dims["num_layers"] * block_size * dims["kv_heads"] * dims["head_dim"] * (1 if kv_int8 else 4)


def check_kv_fits(cfg, dims: dict, ranks_on_node: int) -> None:
    per_block = kv_bytes_per_block(dims, cfg.block_size, cfg.use_cache_kv_int8)
    need = per_block * cfg.num_blocks()
    budget = psutil.virtual_memory().available * MEMORY_FRACTION / max(ranks_on_node, 1)
    if need > budget:
        blocks_per_seq = math.ceil(max(cfg.max_seq_len, cfg.max_dec_len) / cfg.block_size)
        fits = int(budget // (per_block * blocks_per_seq))
        raise ConfigError(
            f"BLOCK_BS={cfg.block_bs} needs {need / 2**30:.1f} GiB of KV cache per rank but only "
            f"{budget / 2**30:.1f} GiB is available; the largest BLOCK_BS that fits is {fits}")


# Settings of features that are not built yet, with the value that means "off": any other value is
# refused at start-up (one line naming the variable) rather than silently ignored.
NOT_BUILT = (("speculate_method", "none"), ("speculate_max_draft_token_num", 1),
             ("speculate_max_ngram_size", 3), ("speculate_model_path", None))


def check_supported(cfg) -> None:
    """Refuse settings whose feature this build lacks, rather than silently ignoring them."""
    from spmd_serve.envs import BY_FIELD

    for field, off in NOT_BUILT:
        value = getattr(cfg, field)
        if value != off:
            raise ConfigError(f"{BY_FIELD[field].name}={value} is not built yet: speculative decoding "
                              f"is not implemented in this version (unset it)")
    if cfg.http_workers > 1:
        log.warning("PUSH_MODE_HTTP_WORKERS=%d: extra HTTP worker processes are not implemented yet; "
                    "serving with one IO thread", cfg.http_workers)


def check_served_model(model_config: dict) -> None:
    """What `spmd_serve export` recorded in config.json must be runnable by this build (CONTRACT §7)."""
    from spmd_serve.export import EXPORT_FORMAT
    from spmd_serve.models.arch import UnsupportedModel, check_dtype_runnable
    from spmd_serve.models.quant import QUANT_METHODS

    served = model_config.get("spmd_serve")
    if served is None:
        return   # older exports: float32, no quantisation; the rank folders are checked elsewhere
    if not isinstance(served, dict):
        raise ConfigError("config.json: the `spmd_serve` key must hold a JSON object (re-export the model)")
    if served.get("format") != EXPORT_FORMAT:
        raise ConfigError(f"config.json: export format {served.get('format')!r}, this build reads {EXPORT_FORMAT}; "
                          "re-export with this version's `spmd_serve export`")
    quant = served.get("quant")
    if quant is not None:
        method = quant.get("method") if isinstance(quant, dict) else quant
        if method not in QUANT_METHODS or not isinstance(quant, dict):
            raise ConfigError(f"config.json: quant={quant!r} is not supported by this build "
                              f"(methods: {', '.join(QUANT_METHODS)}); re-export the model")
        if quant.get("method") == "weight_only_int4" and not quant.get("group_size"):
            raise ConfigError("config.json: weight_only_int4 without a group_size; re-export the model")
    try:
        check_dtype_runnable(served.get("dtype", "float32"))
    except UnsupportedModel as e:
        raise ConfigError(f"config.json: the model was exported with dtype {served.get('dtype')!r}: {e}") from None
