"""The launch sequence of `sample_cuda.sample_gpu`, on one stream: the sampled split's zeroing, the
split scan (greedy rows answered, split sampled rows counted), the sampled split's plan and second
read, its gather of the wanted bins (rows whose region passed the lists), then the main kernel
(ops/kernels/sample_split.cuh and sample_gather.cuh have the picture).  The workspace is laid out
parts | SplitRows | region lists | hash tables (sample_cuda.workspace_bytes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import runtime

# sample_gpu's [B] parameters that every kernel's row test reads, in the kernels' order
_PARAMS = ("temperature", "top_p", "top_k", "rep_penalty", "freq_penalty", "pres_penalty")
PLAN_SMEM = 4096 * (8 + 4)  # sample_split_plan's / _want's dynamic shared memory: 12-bit weight and count histograms
# Profiling only (ops/bench_sample.py): called with each kernel's name right after its launch.
TRACE: Callable[[str], None] | None = None


def _traced(name: str) -> None:
    if TRACE is not None:
        TRACE(name)


@dataclass(frozen=True)
class Launch:
    """One sample_gpu call's sizes and workspace (device pointers as ints)."""

    logits: int
    ld: int
    vocab: int
    dtype: str
    batch: int
    chunks: int  # split-scan chunks per row (scan_chunks)
    chunk: int  # tokens per chunk
    ws: int
    n_eos: int
    n_gen: int
    num_logprobs: int

    def offsets(self) -> tuple[int, int, int, int]:
        """(parts, split rows, region lists, hash tables) in the workspace."""
        from . import sample_cuda as sc

        parts = self.ws
        split = parts + self.batch * sc.MAX_SCAN_CHUNKS * sc.SCAN_PART_BYTES
        lists = split + self.batch * sc.SPLIT_ROW_BYTES
        return parts, split, lists, self.ws + sc._split_end(self.batch, self.chunks)

    def run(self, ptr: dict[str, int], kernel: Any, cap: int, split_sampled: bool, stream: Any) -> None:
        """Every launch; `ptr`: the [B] and [B, n] arguments' device pointers by sample_gpu's names;
        `kernel` the loaded main kernel, `cap` its candidate buffer's entries."""
        from . import sample_cuda as sc

        parts, split, lists, tables = self.offsets()
        opts = sc.compile_options(self.dtype)
        rows = [ptr[n] for n in _PARAMS]
        tests = rows + [ptr["min_tokens"], ptr["num_generated"], np.int32(self.n_eos), np.int32(self.n_gen)]
        row = [self.logits, np.int64(self.ld), np.int32(self.vocab)]
        b_sz, grid = self.batch, (self.chunks, self.batch)

        def load(name: str) -> Any:
            return runtime.load_kernel(sc.CUDA_SOURCE, name, opts)

        if split_sampled:  # (zeroed before the scan adds into them)
            load("sample_split_zero").launch((b_sz,), (sc.SCAN_THREADS,), tests + [split], stream=stream)
            _traced("zero")
        # Greedy rows split over `chunks` blocks each (the main kernel only finishes them), and the
        # split sampled rows' first read
        load(sc.SCAN_KERNELS[self.dtype]).launch(
            grid,
            (sc.SCAN_THREADS,),
            row + tests + [np.int32(self.num_logprobs), np.int32(self.chunk), parts, split if split_sampled else 0],
            stream=stream,
        )
        _traced("scan")
        if split_sampled:
            plan = load("sample_split_plan")
            sc._dynamic_smem_limit(plan)  # opted in: its 48 KiB of histograms and its static Shm pass 48 KiB
            plan.launch(
                (b_sz,), (sc.THREADS,), tests + [np.int32(self.vocab), split], stream=stream, shared_mem=PLAN_SMEM
            )
            _traced("plan")
            chunk_pass = load(sc.SPLIT_PASS_KERNELS[self.dtype])
            chunk_args = row + tests + [np.int32(self.chunk), split, lists]
            chunk_pass.launch(grid, (sc.SCAN_THREADS,), chunk_args + [np.int32(0)], stream=stream)
            _traced("split pass")
            # rows whose region passed the lists: the bins the searches will enter, then their tokens
            want = load("sample_split_want")
            sc._dynamic_smem_limit(want)
            seeds = [ptr["seeds"], ptr["counters"], np.int32(self.num_logprobs), np.int32(cap), split]
            want.launch((b_sz,), (sc.THREADS,), tests + seeds, stream=stream, shared_mem=PLAN_SMEM)
            _traced("want")
            chunk_pass.launch(grid, (sc.SCAN_THREADS,), chunk_args + [np.int32(1)], stream=stream)
            _traced("gather")
        main = row + rows + [ptr["seeds"], ptr["counters"], ptr["min_tokens"], ptr["num_generated"]]
        main += [ptr["eos_ids"], np.int32(self.n_eos), ptr["gen_token_ids"], np.int32(self.n_gen)]
        main += [tables, np.int32(sc.hash_bits(self.n_gen)), np.int32(self.num_logprobs), np.int32(cap)]
        main += [ptr["out_tokens"], ptr["out_logprobs"], ptr.get("out_top_ids", 0), ptr.get("out_top_logprobs", 0)]
        main += [parts, np.int32(self.chunks), split if split_sampled else 0, lists if split_sampled else 0]
        kernel.launch((b_sz,), (sc.THREADS,), main, stream=stream, shared_mem=sc.shared_bytes(self.vocab, cap))
        _traced("main")
