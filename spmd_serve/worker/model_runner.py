"""Runs one rank's shard for a StepPlan: feed each graph segment, join segments with collectives
(or let the graph's own `spmd_allreduce` ops do it), write the new K/V into the paged pool (unless
the graph did), and return the full-vocab logits on rank 0.

Segments are `paddle.inference` predictors loaded from `rank_<i>/` (see models/segment.py for
their inputs/outputs); graphs that call our C++ ops load after `register_graph_ops`.  Identical on every rank; only the collective results differ by rank.
Also the runtime settings the graphs' speed depends on: glibc malloc tuning and which predictor
(plain / decode graph / oneDNN) runs a step.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
from pathlib import Path

import numpy as np

from spmd_serve.models.sharding import ShardDims
from spmd_serve.models.step_tables import step_feeds
from spmd_serve.protocol import StepPlan, split_by_query_len
from spmd_serve.timing import PhaseTimer
from spmd_serve.worker.kv_cache import KVCachePool


# glibc malloc settings for the graph runtime, applied once per rank process before the graphs run.
# Paddle's CPU allocator takes every intermediate tensor from malloc and frees it at once.  With
# glibc's defaults a block above the mmap threshold (128 KiB, raised dynamically only up to the
# largest block freed so far) is a fresh mmap, and freed memory at the top of the heap beyond the
# trim threshold goes back to the kernel: either way the next step's tensor of the same size
# page-faults in again and is zeroed by the kernel.  At batch 32 that was most of a gather's time
# (a 4 MB past-K gather: 3-6 ms, 0.1-0.2 ms with the settings below; RESULTS.md "Speed change 3").
#
# `tune_malloc` keeps blocks up to 32 MiB (glibc's maximum) on the heap and keeps up to
# `MALLOC_KEEP_BYTES` of freed heap mapped, so steady-state steps reuse the same pages.
# `SPMD_MALLOC_TUNING=0` leaves glibc's defaults (e.g. to compare, or under another allocator).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3     # glibc <malloc.h>
MMAP_THRESHOLD_MAX = 32 << 20                    # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
MALLOC_KEEP_BYTES = 1 << 30


def tune_malloc() -> bool:
    """Apply the malloc settings above; False when not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):   # not glibc (musl, macOS): no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(M_TRIM_THRESHOLD, MALLOC_KEEP_BYTES))


# Steps with at least this many tokens run on a oneDNN predictor of each segment (matmuls ~2x faster
# from ~5 tokens a step, slower below: measured crossover ~4, RESULTS.md "Speed change 3"); smaller
# decode steps on a plain predictor of the decode graph.  The second predictor holds a second copy
# of the rank's weights, so by default it is made only for ranks whose params fit in
# ONEDNN_AUTO_MAX_BYTES.  SPMD_ONEDNN_MIN_TOKENS=N overrides (0: never, one plain predictor of the
# general graph per segment).
ONEDNN_MIN_TOKENS = 5
ONEDNN_AUTO_MAX_BYTES = 2 << 30


def onednn_min_tokens(rank_dir: Path, specs: list[dict], requested: int | None) -> int:
    """`requested` (SPMD_ONEDNN_MIN_TOKENS) if set, else ONEDNN_MIN_TOKENS when the twins' extra
    weights are small."""
    if requested is not None:
        return requested
    params = {spec.get("params") or spec["name"] for spec in specs}
    size = sum((rank_dir / f"{p}.pdiparams").stat().st_size for p in params)
    return ONEDNN_MIN_TOKENS if size <= ONEDNN_AUTO_MAX_BYTES else 0


def register_graph_ops(manifest: dict, rank_dir: Path) -> None:
    """Graphs calling our C++ ops (ops/paddle_ext.py) load only once the op library is registered in
    the process: do it, or say why it cannot be (ConfigError)."""
    if not manifest.get("custom_ops"):
        return
    from ops import paddle_ext
    from spmd_serve.config import ConfigError

    reason = paddle_ext.unavailable()
    if reason is not None:
        raise ConfigError(f"{rank_dir} uses the C++ graph ops {', '.join(manifest['custom_ops'])}, which need "
                          f"the op library: {reason}; install what it names or re-export with --graph-ops paddle")


class _Predictor:
    """One paddle.inference predictor of a segment and its input/output handles."""

    def __init__(self, rank_dir: Path, spec: dict, num_threads: int, quantised: bool, onednn: bool) -> None:
        from paddle import inference

        params = spec.get("params") or spec["name"]   # an int8-KV variant loads its fp32 twin's params
        cfg = inference.Config(str(rank_dir / f"{spec['name']}.json"), str(rank_dir / f"{params}.pdiparams"))
        cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.set_cpu_math_library_num_threads(num_threads)
        if onednn:
            cfg.enable_mkldnn()   # primitives are cached per shape (measured: no re-creation cost per step)
        elif hasattr(cfg, "disable_mkldnn"):
            cfg.disable_mkldnn()
        if quantised:
            # constant folding would dequantise the int8/int4 weights once at load, into fp32
            # params: fp32 speed but fp32 memory.  Keep them int8 (memory is the point of --quant).
            cfg.delete_pass("constant_folding_pass")
        self.predictor = inference.create_predictor(cfg)
        self.inputs = {n: self.predictor.get_input_handle(n) for n in self.predictor.get_input_names()}
        self.outputs = [self.predictor.get_output_handle(n) for n in self.predictor.get_output_names()]
        self.output_names: list[str] = spec["outputs"]   # a decode graph may have fewer (no K/V to write)


class Segment:
    """One loaded graph segment and its manifest entry.  With `onednn_min_tokens` > 0 it has two
    predictors: a oneDNN one for steps of >= that many tokens and any step it alone can run, and a
    plain one for the small steps — loading the segment's decode graph (spec["decode"]: single-token
    queries, no grid) when the export has one, since the oneDNN predictor runs small prefills."""

    def __init__(self, rank_dir: Path, spec: dict, num_threads: int, quantised: bool = False,
                 onednn_min_tokens: int = 0) -> None:
        decode = spec.get("decode") if onednn_min_tokens > 0 else None
        self.plain = _Predictor(rank_dir, decode or spec, num_threads, quantised, onednn=False)
        self.plain_decode_only = decode is not None
        self.batched = (_Predictor(rank_dir, spec, num_threads, quantised, onednn=True)
                        if onednn_min_tokens > 0 else None)
        self.min_tokens = onednn_min_tokens
        self.inputs: list[str] = list(dict.fromkeys(spec["inputs"] + (decode or spec)["inputs"]))   # of either graph
        self.outputs: list[str] = spec["outputs"]
        self.kv_layers: list[int] = spec["kv_layers"]
        self.gathers_logits = self.outputs[0] == "logits"

    def bind_cache(self, pool: KVCachePool) -> None:
        for pred in [p for p in (self.plain, self.batched) if p is not None]:
            for name, handle in pred.inputs.items():
                if name.startswith(("k_cache_", "v_cache_", "k_scale_", "v_scale_")):
                    handle.share_external_data(pool.tensor(name))

    def run(self, feeds: dict[str, np.ndarray], decode: bool = False) -> dict[str, np.ndarray]:
        """`decode`: every sequence of this step has one new token."""
        small = len(feeds["input_ids"]) < self.min_tokens and (decode or not self.plain_decode_only)
        pred = self.plain if self.batched is None or small else self.batched
        for name, h in pred.inputs.items():
            if name in feeds:
                h.reshape(list(feeds[name].shape))
                h.copy_from_cpu(feeds[name])
        pred.predictor.run()
        return {n: h.copy_to_cpu() for n, h in zip(pred.output_names, pred.outputs)}


class ModelRunner:
    def __init__(self, model_dir: str | Path, rank: int, comm, num_blocks: int, block_size: int,
                 num_threads: int = 1, kv_int8: bool = False, onednn: int | None = None,
                 malloc_tuning: bool = True) -> None:
        """`onednn`: SPMD_ONEDNN_MIN_TOKENS (None: automatic); `malloc_tuning`: SPMD_MALLOC_TUNING."""
        from spmd_serve.config import ConfigError

        if malloc_tuning:
            tune_malloc()   # before the first step: intermediates reuse heap pages
        rank_dir = Path(model_dir) / f"rank_{rank}"
        manifest = json.loads((rank_dir / "manifest.json").read_text())
        self.dims = manifest["dims"]
        self.comm = comm
        if kv_int8 and "kv_scales" not in manifest:
            raise ConfigError(f"USE_CACHE_KV_INT8=1: {rank_dir} has no int8-KV graphs and scales "
                              "(exported before int8 KV existed); re-export the model with `spmd_serve export`")
        specs = manifest["segments_kv_int8" if kv_int8 else "segments"]
        register_graph_ops(manifest, rank_dir)
        # "graph" collectives: the all-reduces are `spmd_allreduce` ops inside the graph; their time
        # is read from the op library's counter
        self.graph_allreduce = manifest.get("collectives") == "graph"
        if self.graph_allreduce:
            from ops import paddle_ext

            self._graph_allreduce_seconds = paddle_ext.allreduce_seconds
        quantised = bool(manifest.get("quant"))
        self.onednn_min_tokens = onednn_min_tokens(rank_dir, specs, onednn)
        self.segments = [Segment(rank_dir, spec, num_threads, quantised, self.onednn_min_tokens) for spec in specs]
        # where `execute` goes (engine/step_stats.py reads it): each segment, collectives, KV writes
        self.segment_keys = [f"segment_{i}" for i in range(len(self.segments))]
        self.timings = PhaseTimer([*self.segment_keys, "allreduce", "gather_logits", "kv_write"])
        self.pool = KVCachePool(self.dims["num_layers"], num_blocks, block_size, self.dims["kv_heads"],
                                self.dims["head_dim"], manifest["kv_scales"] if kv_int8 else None)
        for seg in self.segments:
            seg.bind_cache(self.pool)
        # what step_feeds builds once per step for all segments (exports before the host-side
        # tables have no inv_freq and ask only for the plan's arrays)
        self.shard_dims = ShardDims(**self.dims)
        self.inv_freq = np.asarray(manifest.get("inv_freq", ()), np.float32)
        self.input_names = {n for seg in self.segments for n in seg.inputs}

    def execute(self, plan: StepPlan) -> np.ndarray | None:
        """Run the plan on this rank's shard; [B, vocab] float32 logits on rank 0, None elsewhere."""
        groups = split_by_query_len(plan.query_lens)
        if len(groups) == 1:
            return self._execute(plan)
        parts = [self._execute(plan.select(g, self.pool.block_size)) for g in groups]
        if parts[0] is None:
            return None
        logits = np.empty((plan.num_seqs, parts[0].shape[1]), np.float32)
        for g, part in zip(groups, parts):
            logits[g] = part                                                 # back to plan order
        return logits

    def _execute(self, plan: StepPlan) -> np.ndarray | None:
        feeds = step_feeds(plan, self.shard_dims, self.inv_freq, self.pool.block_size, self.input_names)
        decode = bool(plan.query_lens.max() == 1)
        logits, timer = None, self.timings
        for key, seg in zip(self.segment_keys, self.segments):
            with timer.phase(key):
                reduced = self._graph_allreduce_seconds() if self.graph_allreduce else 0.0
                out = seg.run(feeds, decode)
            if self.graph_allreduce:   # the graph's own all-reduces count as allreduce, not segment
                reduced = self._graph_allreduce_seconds() - reduced
                timer.add("allreduce", reduced)
                timer.add(key, -reduced)
            with timer.phase("kv_write"):
                for layer in seg.kv_layers:   # this layer's cache is read only by this segment: write now
                    if f"k_new_{layer}" in out:   # (a fused decode graph wrote it already)
                        self.pool.write(layer, plan.slot_mapping, out[f"k_new_{layer}"], out[f"v_new_{layer}"])
            if seg.gathers_logits:
                with timer.phase("gather_logits"):
                    logits = self.comm.gather_vocab(out["logits"])
            else:
                with timer.phase("allreduce"):   # includes waiting for the slowest rank
                    feeds["partial"] = self.comm.allreduce_(out["partial"])   # [T, H] sum of shards
                if "hidden" in out:
                    feeds["hidden"] = out["hidden"]
        if logits is None:
            return None
        return logits[:, : self.dims["vocab"]]                              # drop vocab padding
