"""GPU benchmark of the ops kernels against the memory-bandwidth roofline.

Run `python -m ops.bench` on a machine with an NVIDIA GPU.  It measures the device's copy bandwidth
(cuMemcpyDtoD, counting read + write bytes), then times each kernel on realistic serving shapes and
prints time, achieved bandwidth (bytes the kernel must move / time) and its fraction of the copy
bandwidth.  Decode attention and KV writes are memory bound, so that fraction is the figure of merit
(goal: paged attention >= 70 %).  Allocation uses cuda.bindings only (no cupy / Paddle needed).
Sampling (ops/sample*.py) is timed against one read of its logits (goal <= 3x); further kernels
go in `extra_benches` below.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import paged_attention as pa
from . import runtime
from .kv_cache_write import kv_cache_write_gpu
from .paged_attention import paged_attention_gpu
from .sample_cuda import sample_gpu


@dataclass
class Result:
    name: str
    shape: str
    seconds: float
    nbytes: int  # bytes the kernel has to read + write at minimum
    host_seconds: float  # Python's cost of one call (launch, argument packing)
    note: str = ""  # e.g. a variant's registers and spills


class Buffers:
    """Device allocations of one benchmark, freed together."""

    def __init__(self) -> None:
        self.ptrs: list[int] = []

    def upload(self, host: np.ndarray) -> runtime.DeviceArray:
        host = np.ascontiguousarray(host)
        ptr = runtime.device_alloc(host.nbytes)
        self.ptrs.append(ptr)
        runtime._check(runtime.driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        return runtime.DeviceArray(ptr, host.shape, host.dtype)

    def empty(self, shape: tuple[int, ...], dtype: type) -> runtime.DeviceArray:
        dt: np.dtype[Any] = np.dtype(dtype)
        ptr = runtime.device_alloc(int(np.prod(shape)) * dt.itemsize)
        self.ptrs.append(ptr)
        return runtime.DeviceArray(ptr, tuple(shape), dt)

    def free(self) -> None:
        runtime._check(runtime.driver.cuCtxSynchronize(), "cuCtxSynchronize")
        for p in self.ptrs:
            runtime.device_free(p)
        self.ptrs.clear()


# A one-thread kernel that holds stream 0 busy while the timed calls are queued behind it, so the
# events measure the kernels back to back, not Python's launch cost (which is reported apart).
_SPIN = (
    'extern "C" __global__ void spin_wait(long long cycles) '
    "{ const long long t0 = clock64(); while (clock64() - t0 < cycles) {} }"
)


def time_per_call(fn: Callable[[], object], iters: int = 20, warmup: int = 3) -> tuple[float, float]:
    """(device, host) mean seconds per call: device from CUDA events around `iters` back-to-back
    calls on stream 0 queued behind a spin kernel (so host launch overhead is hidden), host from
    the wall clock of the warm-up calls."""
    drv, chk = runtime.driver, runtime._check
    for _ in range(warmup):
        fn()
    chk(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    host = (time.perf_counter() - t0) / warmup  # launch cost (the GPU may overlap it)
    chk(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    spin = runtime.load_kernel(_SPIN, "spin_wait")
    spin_s = 0.005 + 3 * iters * host  # long enough to queue every timed call behind it
    cycles = int(runtime.device_attribute("CLOCK_RATE") * 1e3 * spin_s)
    start, end = chk(drv.cuEventCreate(0), "cuEventCreate"), chk(drv.cuEventCreate(0), "cuEventCreate")
    spin.launch((1,), (1,), [np.int64(cycles)])
    chk(drv.cuEventRecord(start, drv.CUstream(0)), "cuEventRecord")
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    queued = time.perf_counter() - t0
    chk(drv.cuEventRecord(end, drv.CUstream(0)), "cuEventRecord")
    chk(drv.cuEventSynchronize(end), "cuEventSynchronize")
    ms = chk(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime")
    for event in (start, end):
        drv.cuEventDestroy(event)
    if queued > spin_s:  # the spin ended before all calls were queued
        print(f"warning: queueing took {queued * 1e3:.1f} ms, longer than the spin: host time in", file=sys.stderr)
    return ms / 1e3 / iters, host


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    bufs = Buffers()
    src, dst = bufs.empty((nbytes,), np.uint8), bufs.empty((nbytes,), np.uint8)
    sec, _ = time_per_call(lambda: runtime._check(runtime.driver.cuMemcpyDtoD(dst.ptr, src.ptr, nbytes), "DtoD"))
    bufs.free()
    return 2 * nbytes / sec


def bench_kv_cache_write(
    tokens: int, kv_heads: int = 8, head_dim: int = 128, block_size: int = 64, kv_int8: bool = False
) -> Result:
    rng, bufs = np.random.default_rng(0), Buffers()
    num_blocks = max(1, -(-tokens // block_size)) * 2
    key = bufs.upload(rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float16))
    value = bufs.upload(rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float16))
    pool_dtype = np.int8 if kv_int8 else np.float16
    kc = bufs.empty((num_blocks, block_size, kv_heads, head_dim), pool_dtype)
    vc = bufs.empty((num_blocks, block_size, kv_heads, head_dim), pool_dtype)
    slots = bufs.upload(rng.permutation(num_blocks * block_size)[:tokens].astype(np.int32))
    scales = [bufs.upload(np.full(kv_heads, 0.02, np.float32)) for _ in range(2)] if kv_int8 else [None, None]
    sec, host = time_per_call(lambda: kv_cache_write_gpu(key, value, kc, vc, slots, *scales))
    bufs.free()
    row = kv_heads * head_dim
    nbytes = 2 * tokens * row * (2 + np.dtype(pool_dtype).itemsize) + tokens * 4
    name = f"kv_cache_write{' int8' if kv_int8 else ''}"
    return Result(name, f"T={tokens} kv={kv_heads}x{head_dim} fp16", sec, nbytes, host)


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
    pool_shape = (num_blocks, block_size, kv_heads, head_dim)
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
        opts = pa.compile_options("fp16", kv_int8, head_dim, q_heads // kv_heads)
        regs, local = runtime.load_kernel(pa.SOURCE, "paged_attention", opts).resources()
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
        f"{regs} regs" + (f", {local} B local (spills)" if local else ""),
    )


# Tuning variants of the headline case (B=64, ctx 2048, 32/8 heads of 128): threads per CTA (more
# warps to hide the per-token dependency chains), tokens per iteration, one softmax update per tile,
# and the lazy max (RESCALE_SLACK: no rescale of the accumulators for most tokens).
VARIANTS: list[dict[str, int]] = [
    {"TILE_SOFTMAX": 0},
    {"UNROLL": 1},
    {"UNROLL": 1, "TILE_SOFTMAX": 0},
    {"UNROLL": 4},
    {"NUM_THREADS": 256},
    {"RESCALE_SLACK": 8},
]
# The same few on the other shapes that matter: GQA group 8, int8 KV, a long context (split-K).
OTHER_SHAPES: list[dict[str, Any]] = [{"q_heads": 64, "kv_heads": 8}, {"kv_int8": True}, {"batch": 4, "context": 32768}]
OTHER_VARIANTS: list[dict[str, int]] = [{"TILE_SOFTMAX": 0}, {"UNROLL": 1, "TILE_SOFTMAX": 0}]


def attention_variants() -> list[Result]:
    """The headline case per VARIANTS, then OTHER_VARIANTS on OTHER_SHAPES."""
    rows = [bench_paged_attention(64, 2048, knobs=k) for k in VARIANTS]
    for shape in OTHER_SHAPES:
        args = {"batch": 64, "context": 2048, **shape}
        rows += [bench_paged_attention(**args, knobs=k) for k in OTHER_VARIANTS]
    return rows


def bench_sample(batch: int, vocab: int, label: str, **over: float) -> Result:
    """ops.sample over [batch, vocab] fp32 logits (normal, scale 2), no penalties; `nbytes` = one
    read of the logits, so 100 / (% copy) is the time in units of one read (goal <= 3)."""
    rng, bufs = np.random.default_rng(0), Buffers()
    rows = {
        "temperature": np.float32(over.get("temperature", 1.0)),
        "top_p": np.float32(over.get("top_p", 1.0)),
        "top_k": np.int32(over.get("top_k", 0)),
        "rep_penalty": np.float32(1),
        "freq_penalty": np.float32(0),
        "pres_penalty": np.float32(0),
        "seeds": np.uint64(1),
        "counters": np.int64(0),
        "min_tokens": np.int32(0),
        "num_generated": np.int32(0),
    }
    args: dict[str, Any] = {k: bufs.upload(np.full(batch, v)) for k, v in rows.items()}
    args["counters"] = bufs.upload(np.arange(batch, dtype=np.int64))
    args["eos_ids"] = bufs.upload(np.full((batch, 1), -1, np.int32))
    args["gen_token_ids"] = bufs.upload(np.full((batch, 0), -1, np.int32))
    logits = bufs.upload(rng.standard_normal((batch, vocab), dtype=np.float32) * 2)
    outs: dict[str, Any] = dict(
        out_tokens=bufs.empty((batch,), np.int32), out_logprobs=bufs.empty((batch,), np.float32)
    )
    sec, host = time_per_call(lambda: sample_gpu(logits, **args, **outs))
    bufs.free()
    return Result(f"sample ({label})", f"B={batch} V={vocab} fp32", sec, batch * vocab * 4, host)


def extra_benches() -> list[Result]:
    """>>> Add benchmarks of further kernels here: return one Result per case, with `nbytes` the
    minimum bytes the kernel must move. <<<"""
    return [
        bench_sample(128, 128 * 1024, "greedy", temperature=0.0),
        bench_sample(128, 128 * 1024, "T=1"),
        bench_sample(128, 128 * 1024, "top_p=0.9", top_p=0.9),
        bench_sample(128, 128 * 1024, "top_k=50 top_p=0.9", top_k=50, top_p=0.9),
    ]


def main() -> int:
    if not runtime.gpu_available():
        print(
            "ops.bench needs an NVIDIA GPU and driver (cuInit failed or no device); nothing to measure.",
            file=sys.stderr,
        )
        return 1
    bw = copy_bandwidth()
    print(
        f"device {runtime.device_arch()}, {runtime.sm_count()} SMs; copy bandwidth (cuMemcpyDtoD, read+write): "
        f"{bw / 1e9:.0f} GB/s\n"
    )
    results = [
        bench_kv_cache_write(64),
        bench_kv_cache_write(8192),
        bench_kv_cache_write(8192, kv_int8=True),
        bench_paged_attention(64, 2048, partition_blocks=0),
        bench_paged_attention(64, 2048, partition_blocks=8),
        bench_paged_attention(64, 2048),
        bench_paged_attention(64, 2048, kv_int8=True),
        bench_paged_attention(64, 2048, q_heads=64, kv_heads=8),
        bench_paged_attention(4, 32768),
        bench_paged_attention(4, 32768, partition_blocks=0),
    ]
    variants = attention_variants()
    results += variants + extra_benches()
    print(f"{'kernel':<52} {'shape':<48} {'time us':>9} {'GB/s':>7} {'% copy':>7} {'host us':>8}")
    for r in results:
        gbs = r.nbytes / r.seconds / 1e9
        pct, host_us = 100 * gbs * 1e9 / bw, r.host_seconds * 1e6
        print(f"{r.name:<52} {r.shape:<48} {r.seconds * 1e6:>9.1f} {gbs:>7.0f} {pct:>6.1f}% {host_us:>8.1f}  {r.note}")
    headline = results[5]  # fp16, B=64, ctx 2048, 32/8 heads of 128, automatic split choice
    print(
        f"\n{headline.name} {headline.shape}: {100 * headline.nbytes / headline.seconds / bw:.0f}% of copy "
        f"bandwidth (goal >= 70%)"
    )
    best = min([headline, *(r for r in variants if r.shape == headline.shape)], key=lambda r: r.seconds)
    print(f"fastest variant of it: {best.name}, {100 * best.nbytes / best.seconds / bw:.0f}% of copy bandwidth")
    for r in results:
        if r.name.startswith("sample"):
            print(f"{r.name} {r.shape}: {r.seconds * bw / r.nbytes:.2f}x one read of the logits (goal <= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
