"""paged_attention: decode attention of one query token per sequence over its paged KV cache, with
grouped-query heads, optional int8 KV, and a split-K (flash-decoding) variant for long contexts.

Owns the kernels' source (`SOURCE`: CUDA C in ops/kernels/paged_attention.cu (configuration, the
CUDA-core `attend`), paged_attention_mma.cuh (the tensor-core `attend_mma`, TUNING["MMA"]) and
paged_attention_kernels.cu, after the dtype prelude; kernels `paged_attention`,
`paged_attention_split`, `paged_attention_reduce`), the numpy
twin `paged_attention_cpu` (CPU path and test oracle) and the GPU wrapper `paged_attention_gpu`,
both in the argument order
    (query [B, q_heads, D], k_cache, v_cache [num_blocks, kv_heads, block_size, D] (head-major),
     block_tables [B, max_blocks] int32, context_lens [B] int32, k_scale=None, v_scale=None)
Query head h reads KV head h // (q_heads // kv_heads); scale 1/sqrt(D); an int8 pool is
dequantised as q * scale[kv_head].  context_lens counts the tokens in the cache, the current one
included.  A context length of 0 gives a zero output row.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import runtime
from .kv_cache_write import int8_scale_ptrs, slot_rows

KERNEL_NAMES = ("paged_attention", "paged_attention_split", "paged_attention_reduce")
# The kernels' tuning knobs (the source's macros, defaults there too), chosen by measurement on a
# GPU: `python -m ops.bench` times variants of them.  NUM_THREADS per CTA; UNROLL tokens per thread
# group per loop iteration (more loads in flight, more registers); TILE_SOFTMAX 1: one online-softmax
# update per UNROLL tokens; RESCALE_SLACK > 0: move the running max only when a score passes it by
# more than this (log2 units): most tokens then need no rescale of the accumulators.
# TILE_SOFTMAX 1 measured faster on all four ops.bench shapes on an H200 (1-7 %: RESULTS.md).
# MMA: the tensor-core path (paged_attention_mma.cuh) where it applies (mma_applies) — 0 never, 1 for
# 16-bit pools (the default: 165.7 vs 228.9 us at the bench's headline shape on an H200, 2.4x faster
# with GQA group 8), 2 for int8 pools too (measured slower there: 299 vs 241 us); else the CUDA cores.
# MMA_THREADS: its CTA size (64 measured fastest: 165.7 us, 128: 175.1, 256: 206.9).
TUNING: dict[str, int] = {
    "NUM_THREADS": 128, "UNROLL": 2, "TILE_SOFTMAX": 1, "RESCALE_SLACK": 0, "MMA": 1, "MMA_THREADS": 64
}  # fmt: skip
# The split-K choice (choose_partition_blocks): contexts up to SHORT_CONTEXT tokens take the single
# pass.  Longer ones on the tensor-core kernel: the split, in partitions of PARTITION_TOKENS halved
# (down to MIN_PARTITION_TOKENS) while the (sequence, KV head, partition) CTAs number fewer than
# CTAS_PER_SM a multiprocessor or lie just past one wave of resident CTAs, in (wave, 1.5 wave].
# On the CUDA-core kernel: SHORT_CONTEXT-token partitions until (sequence, KV head) CTAs reach two
# a multiprocessor, then the single pass.
SHORT_CONTEXT, PARTITION_TOKENS, MIN_PARTITION_TOKENS, CTAS_PER_SM = 512, 1024, 256, 3

SOURCE = runtime.kernel_source(
    "prelude.cuh", "paged_attention.cu", "paged_attention_mma.cuh", "paged_attention_kernels.cu"
)


def mma_applies(dtype: str, head_dim: int, group: int, block_size: int) -> bool:
    """Whether the tensor-core path can run this shape (16-bit queries, 16-token tiles in a block)."""
    return dtype != "fp32" and head_dim in (64, 128) and group <= 16 and block_size % 16 == 0


def uses_mma(dtype: str, kv_int8: bool, head_dim: int, group: int, block_size: int) -> bool:
    """Whether the kernels for this shape take the tensor-core path under TUNING["MMA"]."""
    wanted = TUNING["MMA"] >= (2 if kv_int8 else 1)
    return wanted and mma_applies(dtype, head_dim, group, block_size)


def threads_per_cta(dtype: str, kv_int8: bool, head_dim: int, group: int, block_size: int) -> int:
    """The CTA size every kernel of this shape is built for and launched with."""
    return TUNING["MMA_THREADS" if uses_mma(dtype, kv_int8, head_dim, group, block_size) else "NUM_THREADS"]


def compile_options(
    dtype: str, kv_int8: bool = False, head_dim: int = 128, group: int = 4, block_size: int = 16
) -> tuple[str, ...]:
    mma = uses_mma(dtype, kv_int8, head_dim, group, block_size)
    cuda_core_knobs = ("UNROLL", "TILE_SOFTMAX", "RESCALE_SLACK")
    return (
        f"-DDTYPE_ID={runtime.DTYPE_IDS[dtype]}",
        f"-DKV_INT8={int(kv_int8)}",
        f"-DHEAD_DIM={head_dim}",
        f"-DGROUP={group}",
        f"-DNUM_THREADS={threads_per_cta(dtype, kv_int8, head_dim, group, block_size)}",
        *(f"-D{name}={TUNING[name]}" for name in cuda_core_knobs),
        f"-DMMA={int(mma)}",
    )


@contextlib.contextmanager
def tuning(**knobs: int) -> Iterator[None]:
    """Kernels built and launched inside use these TUNING values (ops.bench's variants, the tests
    of each variant), e.g. `tuning(UNROLL=4, TILE_SOFTMAX=1)`."""
    unknown = set(knobs) - set(TUNING)
    if unknown:
        raise ValueError(f"unknown tuning knobs {sorted(unknown)}; known: {sorted(TUNING)}")
    saved = dict(TUNING)
    TUNING.update(knobs)
    try:
        yield
    finally:
        TUNING.clear()
        TUNING.update(saved)


def describe_tuning(knobs: dict[str, int]) -> str:
    """A variant's short label, e.g. "t256 u2 slack8 tile" (knobs left out keep the defaults)."""
    names = {"NUM_THREADS": "t", "UNROLL": "u", "RESCALE_SLACK": "slack", "MMA_THREADS": "mma-t"}
    parts = [f"{names[k]}{v}" for k, v in knobs.items() if k in names]
    if "TILE_SOFTMAX" in knobs:
        parts.append("tile" if knobs["TILE_SOFTMAX"] else "per-token")
    if "MMA" in knobs:
        parts.append({0: "cuda-cores", 1: "mma", 2: "mma-int8"}.get(knobs["MMA"], f"mma{knobs['MMA']}"))
    return " ".join(parts)


# The CI compile test builds these (head_dim 128, 4 query heads per KV head); other shapes compile
# on first use and land in the same disk cache.
VARIANTS = {f"{dt}{'-int8kv' if q else ''}": compile_options(dt, q) for dt in runtime.DTYPE_IDS for q in (False, True)}


def _partials(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One partition: q [H, G, D], k/v [t, H, D] -> max [H, G], sum [H, G], unnormalised out [H, G, D]."""
    s = np.einsum("hgd,thd->hgt", q, k)
    mx = s.max(axis=-1)
    p = np.exp(s - mx[..., None])
    return mx, p.sum(axis=-1), np.einsum("hgt,thd->hgd", p, v)


def paged_attention_cpu(
    query: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    context_lens: np.ndarray,
    k_scale: np.ndarray | None = None,
    v_scale: np.ndarray | None = None,
    *,
    partition_blocks: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """numpy twin (fp32 math).  partition_blocks > 0 runs the split-K algorithm with partitions of
    that many KV blocks (the oracle of paged_attention_split); None/0 a single pass.  Returns `out`
    ([B, q_heads, D], query's dtype unless given)."""
    b_sz, q_heads, hd = query.shape
    _, kvh, bs, _ = k_cache.shape  # [NB, kvh, bs, D]
    group = q_heads // kvh
    result = np.zeros((b_sz, q_heads, hd), np.float32)
    part = (partition_blocks or 0) * bs
    for b in range(b_sz):
        n = int(context_lens[b])
        if n == 0:
            continue
        blocks = block_tables[b, : -(-n // bs)]
        k = slot_rows(k_cache[blocks])[:n].astype(np.float32)  # [n, kvh, hd]
        v = slot_rows(v_cache[blocks])[:n].astype(np.float32)
        if k_scale is not None:
            k *= np.asarray(k_scale, np.float32)[:, None]
            v *= np.asarray(v_scale, np.float32)[:, None]
        q = query[b].astype(np.float32).reshape(kvh, group, hd) / np.float32(math.sqrt(hd))
        step = part or n
        parts = [_partials(q, k[i : i + step], v[i : i + step]) for i in range(0, n, step)]
        mx = np.max([p[0] for p in parts], axis=0)
        total = sum(p[1] * np.exp(p[0] - mx) for p in parts)
        o = sum(p[2] * np.exp(p[0] - mx)[..., None] for p in parts)
        result[b] = (o / total[..., None]).reshape(q_heads, hd)
    if out is None:
        return result.astype(query.dtype)
    out[...] = result
    return out


def workspace_bytes(batch: int, q_heads: int, head_dim: int, max_parts: int) -> int:
    """Split-K scratch: per (sequence, query head, partition) a (max, sum) pair and a float row."""
    return batch * q_heads * max_parts * (2 + head_dim) * 4


def choose_partition_blocks(
    batch: int, kv_heads: int, block_size: int, max_context_len: int, sm_count: int, wave: int = 0
) -> int:
    """0 (single pass) or blocks per split-K partition, by the rules above; `wave`: the CTAs of the
    split kernel the GPU holds at once when it is the tensor-core one, else 0.  Fitted on an H200
    (benchmarks/RESULTS.md "Session 45"; in-sample): the fastest of single / 4 / 8 / 16 blocks at 18
    of 19 shapes (B = 8-256, 1-16 K tokens, GQA 4 and 8, int8 pools), 1.06x at GQA 8 with 2 K
    tokens; 0.90x the old rule's time summed.  The split beat the single pass even as one partition
    a sequence (0.81-0.91x at B = 64-256), and CTAs just past one wave ran 1-6 % slower than twice
    as many half-length ones.  The CUDA-core kernel (int8 pools) was fastest in one pass."""
    if max_context_len <= SHORT_CONTEXT:
        return 0
    if not wave:
        part = max(1, SHORT_CONTEXT // block_size)
        return 0 if max_context_len <= part * block_size or batch * kv_heads >= 2 * sm_count else part

    def ctas(blocks: int) -> int:
        return batch * kv_heads * -(-max_context_len // (blocks * block_size))

    blocks, least = max(1, PARTITION_TOKENS // block_size), max(1, MIN_PARTITION_TOKENS // block_size)
    while blocks > least and (ctas(blocks) < CTAS_PER_SM * sm_count or wave < ctas(blocks) <= wave * 3 // 2):
        blocks //= 2
    return blocks


def paged_attention_gpu(
    query: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    context_lens: Any,
    k_scale: Any = None,
    v_scale: Any = None,
    *,
    out: Any,
    partition_blocks: int | None = None,
    max_context_len: int | None = None,
    workspace: Any = None,
    stream: Any = 0,
) -> Any:
    """The kernels on device arrays (cupy / Paddle GPU tensors / runtime.DeviceArray), twin's order.

    `out` [B, q_heads, D] in query's dtype (uint16 = bf16).  partition_blocks: None = heuristic,
    0 = single pass, n = split-K over n-block partitions.  max_context_len (host int, >= every
    context length; default max_blocks * block_size) sizes the split grid.  The split path needs
    `workspace` (>= workspace_bytes(...)); without it a per-process scratch buffer is used, which is
    only safe while all calls run on one stream.  Asynchronous on `stream`."""
    q, kc, vc, bt, cl, o = (
        runtime.as_device_array(a) for a in (query, k_cache, v_cache, block_tables, context_lens, out)
    )
    b_sz, q_heads, hd = q.shape
    _, kvh, bs, _ = kc.shape  # [NB, kvh, bs, D]
    kv_int8 = kc.dtype == np.int8
    if q_heads % kvh or hd & (hd - 1) or not 32 <= hd <= 256 or kc.shape[3] != hd or vc.shape != kc.shape:
        raise ValueError(
            f"bad shapes: query {q.shape}, pools {kc.shape}/{vc.shape} (head_dim a power of two "
            f"32..256, q_heads a multiple of kv_heads)"
        )
    if o.shape != q.shape or o.dtype != q.dtype or (not kv_int8 and kc.dtype != q.dtype) or vc.dtype != kc.dtype:
        raise TypeError(f"dtype/shape mismatch: query {q.dtype}{q.shape}, out {o.dtype}{o.shape}, pools {kc.dtype}")
    if bt.dtype != np.int32 or cl.dtype != np.int32 or bt.shape[0] != b_sz or cl.shape != (b_sz,):
        raise TypeError("block_tables [B, max_blocks] and context_lens [B] must be int32")
    for a in (q, kc, vc, bt, cl, o):
        if a.strides is not None and a.strides != tuple(
            int(np.prod(a.shape[i + 1 :])) * a.dtype.itemsize for i in range(len(a.shape))
        ):
            raise ValueError("paged_attention_gpu needs C-contiguous arrays")
    if any(a.ptr % 16 for a in (q, kc, vc)):
        raise ValueError("query and pools must be 16-byte aligned (vectorised loads)")
    ks, vs = int8_scale_ptrs(kv_int8, k_scale, v_scale)
    if b_sz == 0:
        return out
    group, max_blocks = q_heads // kvh, bt.shape[1]
    max_len = max_context_len if max_context_len is not None else max_blocks * bs
    dtype = runtime.dtype_name(q.dtype)
    opts = compile_options(dtype, kv_int8, hd, group, bs)
    threads = threads_per_cta(dtype, kv_int8, hd, group, bs)
    if partition_blocks is None:
        sms, wave = runtime.sm_count(), 0
        if max_len > SHORT_CONTEXT and uses_mma(dtype, kv_int8, hd, group, bs):
            wave = sms * runtime.load_kernel(SOURCE, "paged_attention_split", opts).resident_per_sm(threads)
        partition_blocks = choose_partition_blocks(b_sz, kvh, bs, max_len, sms, wave)
    q_mult = np.float32(1.0 / math.sqrt(hd) * math.log2(math.e))  # scores in the log2 domain: exp2f
    common = [bt.ptr, cl.ptr, np.int32(max_blocks), np.int32(bs), q_mult]
    if not partition_blocks:
        kernel = runtime.load_kernel(SOURCE, "paged_attention", opts)
        kernel.launch((kvh, b_sz), (threads,), [o.ptr, q.ptr, kc.ptr, vc.ptr, ks, vs, *common], stream=stream)
        return out
    max_parts = max(1, -(-max_len // (partition_blocks * bs)))
    need = workspace_bytes(b_sz, q_heads, hd, max_parts)
    ws = runtime.workspace_ptr(workspace, need)
    ws_ml, ws_out = ws, ws + b_sz * q_heads * max_parts * 2 * 4  # (max, sum) pairs, then the rows
    split = runtime.load_kernel(SOURCE, "paged_attention_split", opts)
    split.launch(
        (kvh, b_sz, max_parts),
        (threads,),
        [ws_ml, ws_out, q.ptr, kc.ptr, vc.ptr, ks, *common, np.int32(partition_blocks), np.int32(max_parts)],
        stream=stream,
    )
    reduce = runtime.load_kernel(SOURCE, "paged_attention_reduce", opts)
    reduce.launch(
        (q_heads, b_sz),
        (threads,),
        [o.ptr, ws_ml, ws_out, vs, cl.ptr, np.int32(partition_blocks * bs), np.int32(max_parts)],
        stream=stream,
    )
    return out


def paged_attention(query: Any, *args: Any, **kwargs: Any) -> Any:
    """Dispatch: numpy inputs take the CPU twin, device arrays the CUDA kernels."""
    if isinstance(query, np.ndarray):
        for gpu_only in ("stream", "workspace", "max_context_len"):
            kwargs.pop(gpu_only, None)
        return paged_attention_cpu(query, *args, **kwargs)
    return paged_attention_gpu(query, *args, **kwargs)
