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

import numpy as np

from . import runtime
from .bench_attention import attention_variants, bench_paged_attention, partition_sweep
from .bench_sample import sample_args, sample_phases
from .bench_timing import Buffers, Result, copy_bandwidth, time_per_call
from .kv_cache_write import kv_cache_write_gpu
from .sample_cuda import sample_gpu

__all__ = ["Buffers", "Result", "bench_paged_attention", "copy_bandwidth", "main", "time_per_call"]


def bench_kv_cache_write(
    tokens: int, kv_heads: int = 8, head_dim: int = 128, block_size: int = 64, kv_int8: bool = False
) -> Result:
    rng, bufs = np.random.default_rng(0), Buffers()
    num_blocks = max(1, -(-tokens // block_size)) * 2
    key = bufs.upload(rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float16))
    value = bufs.upload(rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float16))
    pool_dtype = np.int8 if kv_int8 else np.float16
    kc = bufs.empty((num_blocks, kv_heads, block_size, head_dim), pool_dtype)
    vc = bufs.empty((num_blocks, kv_heads, block_size, head_dim), pool_dtype)
    slots = bufs.upload(rng.permutation(num_blocks * block_size)[:tokens].astype(np.int32))
    scales = [bufs.upload(np.full(kv_heads, 0.02, np.float32)) for _ in range(2)] if kv_int8 else [None, None]
    sec, host = time_per_call(lambda: kv_cache_write_gpu(key, value, kc, vc, slots, *scales))
    bufs.free()
    row = kv_heads * head_dim
    nbytes = 2 * tokens * row * (2 + np.dtype(pool_dtype).itemsize) + tokens * 4
    name = f"kv_cache_write{' int8' if kv_int8 else ''}"
    return Result(name, f"T={tokens} kv={kv_heads}x{head_dim} fp16", sec, nbytes, host)


def bench_sample(batch: int, vocab: int, label: str, split: bool = True, **over: float) -> Result:
    """ops.sample over [batch, vocab] fp32 logits (normal, scale 2), no penalties; `nbytes` = one
    read of the logits, so 100 / (% copy) is the time in units of one read (goal <= 3).  `split`:
    sampled rows split over many blocks (sample_split.cuh), else their one-block path."""
    bufs = Buffers()
    args = sample_args(bufs, batch, vocab, **over)
    split = split and float(over.get("temperature", 1.0)) > 0  # greedy rows: the staged call's choice
    sec, host = time_per_call(lambda: sample_gpu(**args, split_sampled=split))
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
        bench_sample(128, 128 * 1024, "top_k=50 top_p=0.9, one block", split=False, top_k=50, top_p=0.9),
    ]


SECTIONS = ("kv", "attention", "variants", "partition", "sample", "sample_phases")


def _section_results(section: str) -> list[Result]:
    if section == "kv":
        return [bench_kv_cache_write(64), bench_kv_cache_write(8192), bench_kv_cache_write(8192, kv_int8=True)]
    if section == "attention":
        return [
            bench_paged_attention(64, 2048, partition_blocks=0),
            bench_paged_attention(64, 2048, partition_blocks=8),
            bench_paged_attention(64, 2048),  # the headline: fp16, B=64, ctx 2048, 32/8 heads of 128
            bench_paged_attention(64, 2048, kv_int8=True),
            bench_paged_attention(64, 2048, q_heads=64, kv_heads=8),
            bench_paged_attention(4, 32768),
            bench_paged_attention(4, 32768, partition_blocks=0),
        ]
    if section == "partition":
        return partition_sweep()
    return attention_variants() if section == "variants" else extra_benches()


def main(argv: list[str] | None = None) -> int:
    """`python -m ops.bench [kv] [attention] [variants] [partition] [sample] [sample_phases]`: the named sections
    (all by default), so a kernel that faults on a new device cannot hide the others' figures."""
    sections = list(argv if argv is not None else sys.argv[1:]) or list(SECTIONS)
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        print(f"ops.bench: unknown section(s) {unknown}; choose from {list(SECTIONS)}", file=sys.stderr)
        return 2
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
    if "sample_phases" in sections:  # (prints its own table)
        sample_phases()
    results = [r for s in sections if s != "sample_phases" for r in _section_results(s)]
    if not results:
        return 0
    print(f"{'kernel':<52} {'shape':<48} {'time us':>9} {'GB/s':>7} {'% copy':>7} {'host us':>8}")
    for r in results:
        gbs = r.nbytes / r.seconds / 1e9
        pct, host_us = 100 * gbs * 1e9 / bw, r.host_seconds * 1e6
        print(f"{r.name:<52} {r.shape:<48} {r.seconds * 1e6:>9.1f} {gbs:>7.0f} {pct:>6.1f}% {host_us:>8.1f}  {r.note}")
    headline = "B=64 ctx=2048 q/kv=32/8x128"  # fp16 KV, the automatic split choice and its variants
    attention = [r for r in results if r.shape.startswith(headline) and r.name.startswith("paged_attention (")]
    if attention:
        best = min(attention, key=lambda r: r.seconds)
        print(
            f"\nfastest paged attention at the headline shape: {best.name} {best.shape}, "
            f"{100 * best.nbytes / best.seconds / bw:.0f}% of copy bandwidth (goal >= 70%)"
        )
    for r in results:
        if r.name.startswith("sample"):
            print(f"{r.name} {r.shape}: {r.seconds * bw / r.nbytes:.2f}x one read of the logits (goal <= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
