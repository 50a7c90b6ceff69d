"""Random decode-attention cases (query, paged pools, shuffled block tables) and the check that
`ops.paged_attention_gpu` on a device (a GPU or the CPU emulation) equals its numpy twin: shared by
tests/kernels/test_ops_paged_attention.py and test_ops_paged_attention_tuning.py."""

from __future__ import annotations

import numpy as np

from ops import kv_cache_write as kvw
from ops import paged_attention as pa
from tests.support.ops_helpers import from_storage, to_storage

TOL = {"fp32": 1e-4, "fp16": 2e-3, "bf16": 2e-2}


def make_case(rng, lens, kv_heads, group, head_dim=32, block_size=8, spare_blocks=3):
    """Random query + pools + shuffled block tables for sequences of the given context lengths."""
    b = len(lens)
    max_blocks = max(1, max(-(-n // block_size) for n in lens))
    num_blocks = b * max_blocks + spare_blocks
    q = rng.standard_normal((b, kv_heads * group, head_dim)).astype(np.float32)
    k = rng.standard_normal((num_blocks, kv_heads, block_size, head_dim)).astype(np.float32)
    v = rng.standard_normal((num_blocks, kv_heads, block_size, head_dim)).astype(np.float32)
    tables = rng.permutation(num_blocks)[: b * max_blocks].reshape(b, max_blocks).astype(np.int32)
    return q, k, v, tables, np.array(lens, np.int32)


def pool_scale(pool: np.ndarray) -> np.ndarray:
    """Per-KV-head int8 scales [kvh] that fit a head-major pool [NB, kvh, bs, D] exactly."""
    return (np.abs(pool).max(axis=(0, 2, 3)) / 127).astype(np.float32)


def quantize_pool(pool: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """A head-major pool quantised as ops.kv_cache_write stores rows (quantize_int8 takes [..., kvh, D])."""
    return np.ascontiguousarray(kvw.quantize_int8(pool.transpose(0, 2, 1, 3), scale).transpose(0, 2, 1, 3))


def check_against_twin(device, case, dtype: str, kv_int8: bool, partition_blocks: int | None) -> None:
    """paged_attention_gpu on `case` (make_case's arrays) stored as `dtype` (int8 pools with per-head
    scales) and placed by `device` (put / get: a GPU, or the emulation's HostDevice) equals the twin
    within TOL[dtype] of the output's largest magnitude."""
    q, k, v, tables, cl = case
    qs, qv = to_storage(q, dtype)
    if kv_int8:
        scales = [pool_scale(x) for x in (k, v)]
        k_st, v_st = (quantize_pool(x, s) for x, s in zip((k, v), scales))
        k_val, v_val = k_st, v_st
    else:
        scales = [None, None]
        (k_st, k_val), (v_st, v_val) = to_storage(k, dtype), to_storage(v, dtype)
    out = device.put(np.full(q.shape, 3, qs.dtype))
    pa.paged_attention_gpu(
        *map(device.put, (qs, k_st, v_st, tables, cl)),
        *[device.put(s) if s is not None else None for s in scales],
        out=out,
        partition_blocks=partition_blocks,
        max_context_len=int(cl.max()),
    )
    want = pa.paged_attention_cpu(qv, k_val, v_val, tables, cl, *scales)
    err = np.abs(from_storage(device.get(out), dtype) - want).max() / np.abs(want).max()
    assert err <= TOL[dtype], f"partition_blocks={partition_blocks}: max error {err:.2e} (tolerance {TOL[dtype]})"
