"""The paged-attention rows of `python -m ops.bench`: one case's timing, and the sweep of the
kernel's tuning knobs (pa.TUNING) whose fastest setting becomes the default."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import paged_attention as pa
from . import runtime
from .bench_timing import Buffers, Result, time_per_call
from .paged_attention import paged_attention_gpu


def bench_paged_attention(
    batch: int,
    context: int,
    q_heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 64,
    kv_int8: bool = False,
    partition_blocks: int | None = None,
    knobs: dict[str, int] | None = None,
) -> Result:
    """One case; `knobs` (pa.TUNING values; default: the wrapper's) label the row as a variant, with
    its registers and spills: the rows that decide those defaults."""
    rng, bufs = np.random.default_rng(0), Buffers()
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    query = bufs.upload(rng.standard_normal((batch, q_heads, head_dim)).astype(np.float16))
    out = bufs.empty((batch, q_heads, head_dim), np.float16)
    pool_shape = (num_blocks, kv_heads, block_size, head_dim)
    if kv_int8:  # random bytes are as good as real data for timing
        kc = bufs.upload(rng.integers(-127, 128, pool_shape, dtype=np.int8))
        vc = bufs.upload(rng.integers(-127, 128, pool_shape, dtype=np.int8))
        scales: list[runtime.DeviceArray | None] = [bufs.upload(np.full(kv_heads, 0.01, np.float32)) for _ in range(2)]
    else:
        kc = bufs.upload((rng.standard_normal(pool_shape, dtype=np.float32) * 0.5).astype(np.float16))
        vc = bufs.upload(rng.standard_normal(pool_shape, dtype=np.float32).astype(np.float16))
        scales = [None, None]
    # Shuffled block tables: real pools are fragmented, so do not let the benchmark read contiguously.
    tables = bufs.upload(rng.permutation(num_blocks).reshape(batch, blocks_per_seq).astype(np.int32))
    lens = bufs.upload(np.full(batch, context, np.int32))
    with pa.tuning(**(knobs or {})):
        sec, host = time_per_call(
            lambda: paged_attention_gpu(
                query,
                kc,
                vc,
                tables,
                lens,
                *scales,
                out=out,
                partition_blocks=partition_blocks,
                max_context_len=context,
            )
        )
        opts = pa.compile_options("fp16", kv_int8, head_dim, q_heads // kv_heads, block_size)
        regs, local = runtime.load_kernel(pa.SOURCE, "paged_attention", opts).resources()
        path = "tensor cores" if "-DMMA=1" in opts else "CUDA cores"
    bufs.free()
    kv_bytes = 2 * batch * context * kv_heads * head_dim * (1 if kv_int8 else 2)
    nbytes = kv_bytes + 2 * batch * q_heads * head_dim * 2 + batch * blocks_per_seq * 4
    split = {None: "auto", 0: "single pass"}.get(partition_blocks, f"split {partition_blocks} blocks")
    return Result(
        f"paged_attention{' int8' if kv_int8 else ''} ({split}) {pa.describe_tuning(knobs or {})}".rstrip(),
        f"B={batch} ctx={context} q/kv={q_heads}/{kv_heads}x{head_dim} bs={block_size} fp16",
        sec,
        nbytes,
        host,
        f"{path}, {regs} regs" + (f", {local} B local (spills)" if local else ""),
    )


# Tuning variants of the headline case (B=64, ctx 2048, 32/8 heads of 128).  The default is the
# tensor-core path (MMA 1, MMA_THREADS 64: its warps take 16-token tiles, so the CTA size sets the
# tiles in flight); the CUDA-core kernel (MMA 0; the default for fp32 queries and int8 pools) with
# its knobs: threads per CTA, tokens per iteration, one softmax update per tile, the lazy max.
VARIANTS: list[dict[str, int]] = [
    {"MMA_THREADS": 32},
    {"MMA_THREADS": 128},
    {"MMA_THREADS": 256},
    {"MMA": 0},
    {"MMA": 0, "UNROLL": 1},
    {"MMA": 0, "NUM_THREADS": 256},
]
# The same few on the other shapes that matter: GQA group 8, int8 KV (MMA 2: tensor cores there
# too), a long context (split-K).
OTHER_SHAPES: list[dict[str, Any]] = [{"q_heads": 64, "kv_heads": 8}, {"kv_int8": True}, {"batch": 4, "context": 32768}]
OTHER_VARIANTS: list[dict[str, int]] = [{"MMA": 0}, {"MMA_THREADS": 32}, {"MMA_THREADS": 128}, {"MMA": 2}]


def attention_variants() -> list[Result]:
    """The headline case per VARIANTS, then OTHER_VARIANTS on OTHER_SHAPES."""
    rows = [bench_paged_attention(64, 2048, knobs=k) for k in VARIANTS]
    for shape in OTHER_SHAPES:
        args = {"batch": 64, "context": 2048, **shape}
        rows += [bench_paged_attention(**args, knobs=k) for k in OTHER_VARIANTS]
    return rows
