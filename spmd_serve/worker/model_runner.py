"""Runs one rank's shard for a StepPlan: feed each graph segment, join segments with collectives
(or let the graph's own `spmd_allreduce` ops do it), write the new K/V into the paged pool (unless
the graph did), and return the full-vocab logits on rank 0.

What a rank loads is its `manifest.json` (spmd_serve/manifest.py): the segments (worker/segment.py:
one `paddle.inference` predictor each, see export/segment.py for their inputs/outputs), the KV
layout of its pool (worker/kv_cache.py), and whether its graphs need our C++ op library
(worker/graph_ops.py), whose thread pool gets the rank's threads.  A plan runs in one pass over the
flat tokens when the graphs use the C++ paged attention; graphs with Paddle's attention over a
padded grid run decodes and prefill chunks as separate passes (protocol.split_by_query_len).
Identical on every rank; only the collective results differ by rank.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from spmd_serve.config import ConfigError
from spmd_serve.kv_layout import KV_HEADS
from spmd_serve.manifest import HIDDEN_ROWS, Manifest, ManifestError, read_manifest
from spmd_serve.protocol import StepPlan, split_by_query_len
from spmd_serve.timing import PhaseTimer
from spmd_serve.worker.graph_ops import graph_allreduce_clock, graph_kv_int8_clipped, register_graph_ops
from spmd_serve.worker.kv_cache import KVCachePool
from spmd_serve.worker.malloc import tune_malloc
from spmd_serve.worker.params import HostParams
from spmd_serve.worker.segment import LoadedSegment
from spmd_serve.worker.step_tables import step_feeds

log = logging.getLogger(__name__)


def read_rank_manifest(rank_dir: Path, kv_int8: bool = False) -> Manifest:
    """The rank's manifest, or a one-line ConfigError saying why it cannot be served (and how to fix it)."""
    try:
        manifest = read_manifest(rank_dir)
    except ManifestError as e:
        raise ConfigError(str(e)) from None
    if kv_int8 and manifest.kv_cache.kind != KV_HEADS:
        raise ConfigError(
            f"USE_CACHE_KV_INT8=1: the {manifest.kv_cache.kind} KV cache of {rank_dir} has no int8 form "
            "in this version (DeepSeek's MLA latent pool is fp32 only); unset USE_CACHE_KV_INT8"
        )
    if kv_int8 and not manifest.has_kv_int8:
        raise ConfigError(
            f"USE_CACHE_KV_INT8=1: {rank_dir} has no int8-KV graphs and scales "
            "(exported without them); re-export the model with `spmd_serve export`"
        )
    return manifest


class ModelRunner:
    """One rank's loaded shard: its segments, its KV pool and the timing of each step's parts."""

    def __init__(
        self,
        model_dir: str | Path,
        rank: int,
        comm,
        num_blocks: int,
        block_size: int,
        num_threads: int = 1,
        kv_int8: bool = False,
        malloc_tuning: bool = True,
        huge_pages: bool = True,
        keep_hidden: bool = False,
    ) -> None:
        """`num_threads`: the rank's threads (SPMD_NUM_THREADS resolved); `malloc_tuning`:
        SPMD_MALLOC_TUNING; `huge_pages`: SPMD_HUGE_PAGES, the parameters onto 2 MB pages
        (worker/params.py); `keep_hidden`: keep each step's `hidden_rows` (rank 0 of a target drafted for by its
        MTP layer, and of the MTP draft itself), else they are not copied out."""
        if malloc_tuning:
            tune_malloc()  # before the first step: intermediates reuse heap pages
        rank_dir = Path(model_dir) / f"rank_{rank}"
        self.manifest = manifest = read_rank_manifest(rank_dir, kv_int8)
        self.dims, self.comm = manifest.dims, comm
        # the C++ ops get the threads; Paddle's own kernels only where the graphs are Paddle's alone
        self.op_threads = register_graph_ops(manifest, rank_dir, num_threads)
        paddle_threads = 1 if self.op_threads else num_threads
        self._graph_allreduce_seconds = graph_allreduce_clock(manifest)
        specs = manifest.specs(kv_int8)
        # one copy of the parameters, which every predictor of a file binds (worker/params.py)
        self.params = params = HostParams(huge_pages, num_threads)
        quantised = manifest.quant is not None
        self.segments = [LoadedSegment(rank_dir, spec, params, paddle_threads, quantised) for spec in specs]
        log.info("rank %d: %s", rank, params.report())
        # where `execute` goes (engine/step_stats.py reads it): each segment, collectives, KV writes
        self.segment_keys = [f"segment_{i}" for i in range(len(self.segments))]
        self.timings = PhaseTimer([*self.segment_keys, "allreduce", "gather_logits", "kv_write", "host_io"])
        self.pool = KVCachePool(manifest.kv_cache, num_blocks, block_size, manifest.kv_scales if kv_int8 else None)
        for seg in self.segments:
            seg.bind_cache(self.pool)
        # per segment, the layers whose new K/V the host writes: those its graphs output (a
        # graph with the paged attention op writes its own, and then there is nothing to loop over)
        new_outputs = self.pool.layout.new_outputs
        self._host_kv = [
            [(layer, names) for layer in seg.kv_layers if (names := new_outputs(layer))[0] in seg.all_outputs]
            for seg in self.segments
        ]
        # what step_feeds builds once per step for all segments
        self.inv_freq = manifest.inv_freq_array
        self.input_names = {n for seg in self.segments for n in seg.inputs}
        self.padded_grid = "grid_index" in self.input_names  # Paddle's attention: one pass per query kind
        self._stats: dict[str, np.ndarray] = {}  # this step's graph statistics, summed over its passes
        # int8 pool entries clipped on write: the pool's own writes plus the op library's process-wide
        # counts (baselined here: an earlier runner of this process may have counted some)
        self._op_clipped = graph_kv_int8_clipped(manifest) if kv_int8 else None
        self._clipped_seen = self._clipped_totals()
        self._skip = () if keep_hidden else (HIDDEN_ROWS,)
        # [T, H] the last plan's hidden rows in plan order (graphs that output them, `keep_hidden`)
        self.hidden_rows: np.ndarray | None = None

    def take_stats(self) -> dict[str, np.ndarray]:
        """The statistics the graphs output since the last call (SegmentSpec.stats), then cleared."""
        stats, self._stats = self._stats, {}
        if self.pool.int8:  # every step, zeros too: the counter shows once an int8 pool has run
            totals = self._clipped_totals()
            for t, n in totals.items():
                stats[f"kv_cache_int8_clipped:{t}"] = np.array([n - self._clipped_seen[t]], np.int64)
            self._clipped_seen = totals
        return stats

    def _clipped_totals(self) -> dict[str, int]:
        """Int8 KV entries clipped so far, per cache tensor (k, v)."""
        op = self._op_clipped() if self._op_clipped is not None else (0, 0)
        return {t: self.pool.clipped[t] + n for t, n in zip(self.pool.layout.names(), op)}

    def execute(self, plan: StepPlan) -> np.ndarray | None:
        """Run the plan on this rank's shard; [R, vocab] float32 logits on rank 0 (R = plan.num_rows:
        each sequence's `logits_lens` last tokens, in plan order), None elsewhere."""
        groups = split_by_query_len(plan.query_lens) if self.padded_grid else []
        self.hidden_rows = None
        if len(groups) <= 1:
            return self._execute(plan)
        parts: list[np.ndarray | None] = []
        hidden: list[np.ndarray | None] = []
        for g in groups:
            parts.append(self._execute(plan.select(g, self.pool.block_size)))
            hidden.append(self.hidden_rows)
        if hidden[0] is not None:  # back to plan order
            starts = np.concatenate([[0], np.cumsum(plan.query_lens)]).astype(np.int64)
            tokens = np.concatenate([np.arange(starts[i], starts[i + 1]) for g in groups for i in g])
            self.hidden_rows = np.empty((plan.num_tokens, hidden[0].shape[1]), np.float32)
            self.hidden_rows[tokens] = np.concatenate([h for h in hidden if h is not None])
        if parts[0] is None:
            return None
        logits = np.empty((plan.num_rows, parts[0].shape[1]), np.float32)
        first = np.concatenate([[0], np.cumsum(plan.row_lens)]).astype(np.int64)  # [B + 1] row starts
        for g, part in zip(groups, parts):
            rows = np.concatenate([np.arange(first[i], first[i + 1]) for i in g])
            logits[rows] = part  # back to plan order
        return logits

    def _execute(self, plan: StepPlan) -> np.ndarray | None:
        feeds = step_feeds(plan, self.dims, self.inv_freq, self.pool.block_size, self.input_names)
        decode = plan.num_tokens == plan.num_seqs  # every query one token (each has >= 1)
        logits, timer, clock = None, self.timings, self._graph_allreduce_seconds
        for key, seg, host_kv in zip(self.segment_keys, self.segments, self._host_kv):
            with timer.phase("host_io"):  # the copies into and out of the graph, apart from it
                pred = seg.feed(feeds, decode)
            with timer.phase(key):
                reduced = clock() if clock is not None else 0.0
                pred.predictor.run()
            with timer.phase("host_io"):
                out = seg.fetch(pred, self._skip)
            if clock is not None:  # the graph's own all-reduces count as allreduce, not segment
                reduced = clock() - reduced
                timer.add("allreduce", reduced)
                timer.add(key, -reduced)
            if host_kv:
                with timer.phase("kv_write"):
                    for layer, names in host_kv:  # this layer's cache is read only by this segment: write now
                        if names[0] in out:  # (an MLA decode graph's op wrote it already)
                            self.pool.write(layer, plan.slot_mapping, *(out[n] for n in names))
            for name in seg.stats:
                self._stats[name] = self._stats[name] + out[name] if name in self._stats else out[name]
            if HIDDEN_ROWS in out:
                self.hidden_rows = out[HIDDEN_ROWS]
            if seg.gathers_logits:
                with timer.phase("gather_logits"):
                    logits = self.comm.gather_vocab(out["logits"])
            else:
                with timer.phase("allreduce"):  # includes waiting for the slowest rank
                    feeds["partial"] = self.comm.allreduce_(out["partial"])  # [T, H] sum of shards
                if "hidden" in out:
                    feeds["hidden"] = out["hidden"]
        if logits is None:
            return None
        return logits[:, : self.dims.vocab]  # drop vocab padding
