"""Tensor parallelism played in one process, for graph-tier tests (helper module, not a test file).

`SimRank` holds what a ModelRunner holds of one rank (its loaded segments and its own paged KV
pool); `run_outputs` runs a plan through every rank's segments, with the collectives between them
done by hand (partials summed = allreduce, logits concatenated = gather) and each rank's new cache
entries written at the slot mapping, as ModelRunner.execute does.  So TP > 1 exports here are the
`--graph-ops paddle` ones (a graph per stage).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class OneRank:
    """A ModelRunner's collectives at tp = 1: the logits are already whole."""

    @staticmethod
    def gather_vocab(logits: np.ndarray) -> np.ndarray:
        return logits


class SimRank:
    """One rank's loaded segments and its own KV pool."""

    def __init__(self, model_dir: Path, rank: int, num_blocks: int, block_size: int) -> None:
        from spmd_serve.manifest import read_manifest
        from spmd_serve.worker.graph_ops import register_graph_ops
        from spmd_serve.worker.kv_cache import KVCachePool
        from spmd_serve.worker.params import HostParams
        from spmd_serve.worker.segment import LoadedSegment

        rank_dir = Path(model_dir) / f"rank_{rank}"
        manifest = read_manifest(rank_dir)
        register_graph_ops(manifest, rank_dir)  # a C++-ops export's GEMMs and paged attention
        self.dims, self.inv_freq = manifest.dims, manifest.inv_freq_array
        params = HostParams()  # as a served rank's: one copy, bound into each predictor
        self.segments = [LoadedSegment(rank_dir, spec, params) for spec in manifest.segments]
        self.pool = KVCachePool(manifest.kv_cache, num_blocks, block_size)
        for seg in self.segments:
            seg.bind_cache(self.pool)


def run_outputs(ranks: list[SimRank], plan, extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Rank 0's outputs of the last segment, `logits` gathered over the vocab (padding dropped).
    `extra`: further graph inputs (e.g. an MTP draft's `prev_hidden`); a plan whose every query is
    one token runs the decode graphs where the export has them."""
    from spmd_serve.worker.step_tables import step_feeds

    names = {n for seg in ranks[0].segments for n in seg.inputs}
    base = step_feeds(plan, ranks[0].dims, ranks[0].inv_freq, ranks[0].pool.block_size, names)
    feeds = [dict(base, **(extra or {})) for _ in ranks]
    decode = bool(plan.query_lens.max() == 1)
    num_segments = len(ranks[0].segments)
    assert all(len(r.segments) == num_segments for r in ranks)
    for k in range(num_segments):
        outs = [r.segments[k].run(f, decode) for r, f in zip(ranks, feeds)]
        for r, out in zip(ranks, outs):
            for layer in r.segments[k].kv_layers:
                new = r.pool.layout.new_outputs(layer)
                if new[0] in out:  # (the C++ paged attention / MLA decode op writes the pool itself)
                    r.pool.write(layer, plan.slot_mapping, *(out[n] for n in new))
        if ranks[0].segments[k].gathers_logits:
            assert k == num_segments - 1
            logits = np.concatenate([o["logits"] for o in outs], axis=1)  # gather over vocab
            return dict(outs[0], logits=logits[:, : ranks[0].dims.vocab])
        total = np.sum([o["partial"] for o in outs], axis=0, dtype=np.float32)  # allreduce
        for f, o in zip(feeds, outs):
            f["partial"] = total.copy()
            if "hidden" in o:
                f["hidden"] = o["hidden"]
    raise AssertionError("no segment produced logits")


def run_step(ranks: list[SimRank], plan) -> np.ndarray:
    """The plan's logits [R, vocab]."""
    return run_outputs(ranks, plan)["logits"]
