"""Runs one rank's shard for a StepPlan: feed each graph segment, join segments with collectives,
write the new K/V into the paged pool, and return the full-vocab logits on rank 0.

Segments are `paddle.inference` predictors loaded from `rank_<i>/` (see models/segment.py for
their inputs/outputs).  Identical on every rank; only the collective results differ by rank.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from spmd_serve.engine.step_stats import RunnerTimings
from spmd_serve.protocol import StepPlan, grid_indices, split_by_query_len
from spmd_serve.worker.kv_cache import KVCachePool


class Segment:
    """One loaded graph segment and its manifest entry."""

    def __init__(self, rank_dir: Path, spec: dict, num_threads: int, quantised: bool = False) -> None:
        from paddle import inference

        params = spec.get("params") or spec["name"]   # an int8-KV variant loads its fp32 twin's params
        cfg = inference.Config(str(rank_dir / f"{spec['name']}.json"), str(rank_dir / f"{params}.pdiparams"))
        cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.set_cpu_math_library_num_threads(num_threads)
        if hasattr(cfg, "disable_mkldnn"):
            cfg.disable_mkldnn()   # oneDNN re-creates primitives per shape: slower at small batch (DESIGN §4)
        if quantised:
            # constant folding would dequantise the int8/int4 weights once at load, into fp32
            # params: fp32 speed but fp32 memory.  Keep them int8 (memory is the point of --quant).
            cfg.delete_pass("constant_folding_pass")
        self.predictor = inference.create_predictor(cfg)
        self.inputs: list[str] = spec["inputs"]
        self.outputs: list[str] = spec["outputs"]
        self.kv_layers: list[int] = spec["kv_layers"]
        self.gathers_logits = self.outputs[0] == "logits"
        self._in = {n: self.predictor.get_input_handle(n) for n in self.predictor.get_input_names()}
        self._out = [self.predictor.get_output_handle(n) for n in self.predictor.get_output_names()]

    def bind_cache(self, pool: KVCachePool) -> None:
        for name in self.inputs:
            if name.startswith(("k_cache_", "v_cache_", "k_scale_", "v_scale_")):
                self._in[name].share_external_data(pool.tensor(name))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name in self.inputs:
            if name in feeds:
                h = self._in[name]
                h.reshape(list(feeds[name].shape))
                h.copy_from_cpu(feeds[name])
        self.predictor.run()
        return {n: h.copy_to_cpu() for n, h in zip(self.outputs, self._out)}


class ModelRunner:
    def __init__(self, model_dir: str | Path, rank: int, comm, num_blocks: int, block_size: int,
                 num_threads: int = 1, kv_int8: bool = False) -> None:
        from spmd_serve.config import ConfigError

        rank_dir = Path(model_dir) / f"rank_{rank}"
        manifest = json.loads((rank_dir / "manifest.json").read_text())
        self.dims = manifest["dims"]
        self.comm = comm
        if kv_int8 and "kv_scales" not in manifest:
            raise ConfigError(f"USE_CACHE_KV_INT8=1: {rank_dir} has no int8-KV graphs and scales "
                              "(exported before int8 KV existed); re-export the model with `spmd_serve export`")
        specs = manifest["segments_kv_int8" if kv_int8 else "segments"]
        quantised = bool(manifest.get("quant"))
        self.segments = [Segment(rank_dir, spec, num_threads, quantised) for spec in specs]
        self.timings = RunnerTimings(len(self.segments))   # where `execute` goes (step_stats.py)
        self.pool = KVCachePool(self.dims["num_layers"], num_blocks, block_size, self.dims["kv_heads"],
                                self.dims["head_dim"], manifest["kv_scales"] if kv_int8 else None)
        for seg in self.segments:
            seg.bind_cache(self.pool)

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
        pad_index, unpad_index, logits_index = grid_indices(plan.query_lens)
        feeds: dict[str, np.ndarray] = {
            "input_ids": plan.input_ids, "positions": plan.positions, "pad_index": pad_index,
            "unpad_index": unpad_index, "block_tables": plan.block_tables, "ctx_lens": plan.ctx_lens,
            "query_lens": plan.query_lens, "logits_index": logits_index}
        logits = None
        acc, clock = self.timings.seconds, time.perf_counter   # ~100 ns a lap: no per-token cost
        t = clock()
        for key, seg in zip(self.timings.segment_keys, self.segments):
            out = seg.run(feeds)
            t, t0 = clock(), t
            acc[key] += t - t0
            for layer in seg.kv_layers:   # this layer's cache is read only by this segment: write now
                self.pool.write(layer, plan.slot_mapping, out[f"k_new_{layer}"], out[f"v_new_{layer}"])
            t, t0 = clock(), t
            acc["kv_write"] += t - t0
            if seg.gathers_logits:
                logits = self.comm.gather_vocab(out["logits"])
                t, t0 = clock(), t
                acc["gather_logits"] += t - t0
            else:
                feeds["partial"] = self.comm.allreduce_(out["partial"])   # [T, H] sum of shards
                t, t0 = clock(), t
                acc["allreduce"] += t - t0   # includes waiting for the slowest rank
                if "hidden" in out:
                    feeds["hidden"] = out["hidden"]
        if logits is None:
            return None
        return logits[:, : self.dims["vocab"]]                              # drop vocab padding
