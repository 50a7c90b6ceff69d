"""`LoadedSegment`: one graph segment of a rank (manifest `SegmentSpec`) loaded as predictors.

The export traced it (export/segment.py: `GraphSegment`); here it is fed named host arrays and
returns named outputs.  Its KV-cache inputs are bound once to the pool's zero-copy tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spmd_serve.manifest import SegmentSpec
from spmd_serve.worker.kv_cache import KVCachePool
from spmd_serve.worker.predictor import Predictor


class LoadedSegment:
    """One loaded graph segment and its manifest entry.  With `onednn_min_tokens` > 0 it has two
    predictors: a oneDNN one for steps of >= that many tokens and any step it alone can run, and a
    plain one for the small steps — loading the segment's decode graph (spec.decode: single-token
    queries, no grid) when the export has one, since the oneDNN predictor runs small prefills."""

    def __init__(
        self, rank_dir: Path, spec: SegmentSpec, num_threads: int, quantised: bool = False, onednn_min_tokens: int = 0
    ) -> None:
        decode = spec.decode if onednn_min_tokens > 0 else None
        self.plain = Predictor(rank_dir, decode or spec, num_threads, quantised, onednn=False)
        self.plain_decode_only = decode is not None
        self.batched = Predictor(rank_dir, spec, num_threads, quantised, onednn=True) if onednn_min_tokens > 0 else None
        self.min_tokens = onednn_min_tokens
        self.inputs: list[str] = list(dict.fromkeys(spec.inputs + (decode or spec).inputs))  # of either graph
        self.outputs: tuple[str, ...] = spec.outputs
        self.kv_layers: tuple[int, ...] = spec.kv_layers
        self.gathers_logits = spec.gathers_logits
        self.stats: tuple[str, ...] = spec.stats

    def bind_cache(self, pool: KVCachePool) -> None:
        """Share the pool's arrays with the cache (and int8 scale) inputs of every predictor."""
        for pred in [p for p in (self.plain, self.batched) if p is not None]:
            for name, handle in pred.inputs.items():
                if name in pool:
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
