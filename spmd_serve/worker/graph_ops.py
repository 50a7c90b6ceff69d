"""Registering our C++ graph ops (ops/paddle_ext.py) in a rank process before its graphs load, and
sizing their thread pool.

A graph that calls `spmd_allreduce`, `spmd_paged_attention`, `spmd_linear*` or the norms loads only
once the op library is registered; the manifest lists the ops a rank's graphs call (`custom_ops`).
"""

from __future__ import annotations

from pathlib import Path

from spmd_serve.config import ConfigError
from spmd_serve.manifest import Manifest


def register_graph_ops(manifest: Manifest, rank_dir: Path, num_threads: int = 1) -> int:
    """Register the op library when the rank's graphs need it and give its thread pool `num_threads`
    (the workers are made once, here, and inherit the rank's CPU binding); or say why it cannot be
    (ConfigError).  The pool's threads as the library reports them; 0 when the graphs do not use it."""
    if not manifest.custom_ops:
        return 0
    from ops import paddle_ext

    reason = paddle_ext.unavailable()
    if reason is not None:
        raise ConfigError(
            f"{rank_dir} uses the C++ graph ops {', '.join(manifest.custom_ops)}, which need "
            f"the op library: {reason}; install what it names or re-export with --graph-ops paddle"
        )
    paddle_ext.set_num_threads(num_threads)
    return paddle_ext.num_threads()


def graph_allreduce_clock(manifest: Manifest):
    """The op library's running total of seconds spent in in-graph all-reduces ("graph" collectives),
    or None when the graphs have none: the runner counts that time as allreduce, not as the segment's."""
    if manifest.collectives != "graph":
        return None
    from ops import paddle_ext

    return paddle_ext.allreduce_seconds


def graph_kv_int8_clipped(manifest: Manifest):
    """The op library's running (K, V) counts of int8 pool entries its paged-attention op clipped,
    or None when this rank's graphs do not write the pool themselves (the runner's pool counts)."""
    if "spmd_paged_attention_int8" not in manifest.custom_ops:
        return None
    from ops import paddle_ext

    return paddle_ext.kv_int8_clipped
