"""The speculative-decoding metrics (spmd_serve/engine/spec_metrics.py) through EngineMetrics."""

from __future__ import annotations

import pytest

from spmd_serve.engine.metrics import EngineMetrics


def test_counters_and_rates_per_method():
    m = EngineMetrics()
    m.on_spec("ngram", 2, 8, 6)  # two sequences verified 8 drafts, 6 accepted
    m.on_spec("ngram", 1, 4, 0)
    m.on_spec("ngram", 0, 0, 0)  # a step without drafts changes nothing
    with m.paused():
        m.on_spec("ngram", 1, 4, 4)  # warm-up: not counted
    get = m.registry.get_sample_value
    assert get("spmd_serve:spec_decode_num_drafts_total", {"method": "ngram"}) == 3
    assert get("spmd_serve:spec_decode_num_draft_tokens_total", {"method": "ngram"}) == 12
    assert get("spmd_serve:spec_decode_num_accepted_tokens_total", {"method": "ngram"}) == 6
    assert get("spmd_serve:spec_decode_draft_acceptance_rate", {"method": "ngram"}) == pytest.approx(0.5)
    # tokens per verifying sequence step: (6 accepted + 3 target tokens) / 3
    assert get("spmd_serve:spec_decode_mean_accepted_length", {"method": "ngram"}) == pytest.approx(3.0)
