"""The paged-attention rows of `python -m ops.bench`: one case's timing, the sweep of the
kernel's tuning knobs (pa.TUNING) whose fastest setting becomes the default, and the sweep of the
split-K partition sizes over batch and context that pa.choose_partition_blocks was fitted on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import paged_attention as pa
from . import runtime
from .bench_timing import Buffers, Result, time_per_call
from .paged_attention import paged_attention_gpu


def _tiled(shape: tuple[int, ...], draw: Callable[[int], np.ndarray], limit: int = 1 << 24) -> np.ndarray:
    """An array of `shape` from at most `limit` values of `draw(n)`, repeated: a sweep's multi-GiB
    pools are made in a copy's time (the kernel's time does not depend on the values)."""
    n = int(np.prod(shape))
    return np.resize(draw(min(n, limit)), shape)


def _normal_fp16(rng: np.random.Generator, scale: float) -> Callable[[int], np.ndarray]:
    def draw(n: int) -> np.ndarray:
        return (rng.standard_normal(n, dtype=np.float32) * scale).astype(np.float16)

    return draw


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
        kc, vc = (bufs.upload(_tiled(pool_shape, lambda n: rng.integers(-127, 128, n, dtype=np.int8))) for _ in "kv")
        scales: list[runtime.DeviceArray | None] = [bufs.upload(np.full(kv_heads, 0.01, np.float32)) for _ in range(2)]
    else:
        kc = bufs.upload(_tiled(pool_shape, _normal_fp16(rng, 0.5)))
        vc = bufs.upload(_tiled(pool_shape, _normal_fp16(rng, 1.0)))
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


# The split-K choice (pa.choose_partition_blocks) against each fixed split, over batch and context:
# the rows that decide its constants (fp16 pools of 32/8 heads of 128 unless said, blocks of 64).
FP16_SHAPES = [(16, 1024), (64, 1024), (128, 1024), (256, 1024), (32, 2048), (64, 2048), (128, 2048), (256, 2048)]
FP16_SHAPES += [(16, 4096), (32, 4096), (64, 4096), (128, 4096), (8, 16384)]
PARTITION_CASES: list[dict[str, Any]] = [
    *({"batch": b, "context": c} for b, c in FP16_SHAPES),
    *({"batch": 64, "context": c, "q_heads": 64} for c in (1024, 2048, 4096)),  # GQA group 8
    *({"batch": 64, "context": c, "kv_int8": True} for c in (1024, 2048, 4096)),
]
PARTITION_SPLITS = [None, 0, 4, 8, 16]


def partition_sweep() -> list[Result]:
    return [bench_paged_attention(**case, partition_blocks=p) for case in PARTITION_CASES for p in PARTITION_SPLITS]
