"""`LoadedSegment`: one graph segment of a rank (manifest `SegmentSpec`) loaded as a predictor.

The export traced it (export/segment.py: `GraphSegment`); here it is fed named host arrays and
returns named outputs.  Its KV-cache inputs are bound once to the pool's zero-copy tensors.  One
predictor runs every step (prefill chunks, decodes, mixed): no second predictor or graph is chosen
by the step's or the model's size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spmd_serve.manifest import SegmentSpec
from spmd_serve.worker.kv_cache import KVCachePool
from spmd_serve.worker.predictor import Predictor


class LoadedSegment:
    """One loaded graph segment and its manifest entry."""

    def __init__(self, rank_dir: Path, spec: SegmentSpec, paddle_threads: int = 1, quantised: bool = False) -> None:
        self.predictor = Predictor(rank_dir, spec, paddle_threads, quantised)
        self.inputs: list[str] = list(spec.inputs)
        self.outputs: tuple[str, ...] = spec.outputs
        self.kv_layers: tuple[int, ...] = spec.kv_layers
        self.gathers_logits = spec.gathers_logits

    def bind_cache(self, pool: KVCachePool) -> None:
        """Share the pool's arrays with the cache (and int8 scale) inputs of the predictor."""
        for name, handle in self.predictor.inputs.items():
            if name in pool:
                handle.share_external_data(pool.tensor(name))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pred = self.predictor
        for name, h in pred.inputs.items():
            if name in feeds:
                h.reshape(list(feeds[name].shape))
                h.copy_from_cpu(feeds[name])
        pred.predictor.run()
        return {n: h.copy_to_cpu() for n, h in zip(pred.output_names, pred.outputs)}
