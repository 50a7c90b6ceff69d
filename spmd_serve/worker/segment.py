"""`LoadedSegment`: one graph segment of a rank (manifest `SegmentSpec`) loaded as a predictor.

The export traced it (export/segment.py: `GraphSegment`); here it is fed named host arrays and
returns named outputs.  Its KV-cache inputs are bound once to the pool's zero-copy tensors.  One
predictor runs every step (prefill chunks, decodes, mixed): nothing is chosen by the step's or the
model's size.  A family whose attention has no C++ op for chunks of queries (DeepSeek's MLA) also
exports a decode graph (`spec.decode`: every query one token), loaded as a second predictor for
the steps that are all decodes; both are bound to the rank's one copy of the segment's parameters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spmd_serve.manifest import SegmentSpec
from spmd_serve.worker.kv_cache import KVCachePool
from spmd_serve.worker.params import HostParams
from spmd_serve.worker.predictor import Predictor


class LoadedSegment:
    """One loaded graph segment and its manifest entry."""

    def __init__(
        self,
        rank_dir: Path,
        spec: SegmentSpec,
        params: HostParams | None,
        paddle_threads: int = 1,
        quantised: bool = False,
    ) -> None:
        """`params`: the rank's parameters, which both predictors bind (worker/params.py)."""

        def load(graph: SegmentSpec) -> Predictor:
            return Predictor(rank_dir, graph, paddle_threads, quantised, params)

        self.predictor = load(spec)
        self.decode = None if spec.decode is None else load(spec.decode)
        self.inputs: list[str] = list(dict.fromkeys(spec.inputs + (spec.decode or spec).inputs))  # of either graph
        self.outputs: tuple[str, ...] = spec.outputs
        self.all_outputs = frozenset(spec.outputs + (spec.decode.outputs if spec.decode else ()))  # of either graph
        self.kv_layers: tuple[int, ...] = spec.kv_layers
        self.gathers_logits = spec.gathers_logits
        self.stats: tuple[str, ...] = spec.stats

    def bind_cache(self, pool: KVCachePool) -> None:
        """Share the pool's arrays with the cache (and int8 scale) inputs of the predictors."""
        for pred in [p for p in (self.predictor, self.decode) if p is not None]:
            for name, handle in pred.inputs.items():
                if name in pool:
                    handle.share_external_data(pool.tensor(name))

    def feed(self, feeds: dict[str, np.ndarray], decode: bool = False) -> Predictor:
        """Copy the step's inputs into the graph that runs it (`decode`: every sequence of this step
        has one new token, so the decode graph, if any) and return that graph's predictor."""
        pred = self.decode if decode and self.decode is not None else self.predictor
        for name, h in pred.inputs.items():
            if name in feeds:
                h.copy_from_cpu(feeds[name])  # takes the array's shape (no reshape call: one less per input)
        return pred

    def fetch(self, pred: Predictor, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """The outputs of `pred`'s last run; those named in `skip` are not copied out (e.g. hidden
        rows nobody reads)."""
        return {n: h.copy_to_cpu() for n, h in zip(pred.output_names, pred.outputs) if n not in skip}

    def run(
        self, feeds: dict[str, np.ndarray], decode: bool = False, skip: tuple[str, ...] = ()
    ) -> dict[str, np.ndarray]:
        """feed, run, fetch (the runner times the copies apart from the graph)."""
        pred = self.feed(feeds, decode)
        pred.predictor.run()
        return self.fetch(pred, skip)
