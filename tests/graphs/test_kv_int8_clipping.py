"""Int8 KV entries clipped on write are counted and reach /metrics (issue 17 item 5): the runner's
`take_stats` reports `kv_cache_int8_clipped:<tensor>` every step of an int8 pool — from the C++
paged-attention op's counters (`--graph-ops cpp`) or the pool's own numpy writer (`paddle`) — and
`EngineMetrics` adds it to `spmd_serve:kv_cache_int8_clipped_total{tensor}`.  Text the export
calibrated on clips nothing; the same step with the scales cut to a fifth clips K and V."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.metrics_scrape import Samples
from tests.support.sim_ranks import OneRank


def prefill(ids: np.ndarray, block: int, step_id: int):
    """One sequence's prefill of `ids` from position 0 into block `block` (block size 16)."""
    from spmd_serve.protocol import RUN, StepPlan

    n = len(ids)
    return StepPlan(
        RUN, step_id, ids, np.arange(n), np.array([n]), np.array([0]), np.array([[block]]), block * 16 + np.arange(n)
    )


@pytest.fixture(scope="module")
def exports(served_tp1, demo_checkpoint, tmp_path_factory):
    from spmd_serve.export import export_checkpoint

    out = tmp_path_factory.mktemp("kv8clip") / "paddle"
    return {"cpp": served_tp1, "paddle": export_checkpoint(demo_checkpoint, out, tp=1, graph_ops="paddle")}


@pytest.mark.parametrize("graph_ops", ["cpp", "paddle"])
def test_clipped_int8_kv_entries_reach_the_metrics(exports, demo_checkpoint, graph_ops):
    from spmd_serve.engine.metrics import EngineMetrics
    from spmd_serve.export.calibration_text import calibration_windows
    from spmd_serve.worker.model_runner import ModelRunner

    runner = ModelRunner(exports[graph_ops], 0, OneRank(), num_blocks=4, block_size=16, kv_int8=True)
    (window,), _ = calibration_windows(demo_checkpoint, 1024, 2048)
    text = window.ids[:16]  # the calibration's own first tokens: within its scales by the margin
    runner.execute(prefill(text, 1, 1))
    calm = runner.take_stats()
    assert {k: v.tolist() for k, v in calm.items()} == {"kv_cache_int8_clipped:k": [0], "kv_cache_int8_clipped:v": [0]}
    for scales in runner.pool.scales.values():  # the graphs read these arrays in place
        for layer in scales:
            layer *= 0.2
    runner.execute(prefill(text, 2, 2))
    hot = runner.take_stats()
    k, v = int(hot["kv_cache_int8_clipped:k"][0]), int(hot["kv_cache_int8_clipped:v"][0])
    written = 16 * sum(layer[0, 0].size for layer in runner.pool.k)  # K entries of 16 tokens, every layer
    assert 0 < k <= written and 0 < v <= written
    assert runner.take_stats()["kv_cache_int8_clipped:k"].tolist() == [0]  # cleared on read
    metrics = EngineMetrics()
    for stats in (calm, hot):
        metrics.on_model_stats(stats)
    s = Samples.of(metrics.registry)
    assert (
        s.get("kv_cache_int8_clipped_total", tensor="k") == k and s.get("kv_cache_int8_clipped_total", tensor="v") == v
    )
