"""One fast path for every step and every model size (issue 16): a C++-ops export of a narrow and of
a 16x wider Llama has the same graphs op for op, and the runner loads each the same way — one
plain predictor per segment with the same settings — so nothing is chosen by the model's size (an
earlier runtime dropped its fast predictors above 2 GiB of parameters), and moves each one's parameters
onto 2 MB pages the same way (worker/params.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from tests.support.model_zoo import ARCHS, make_weights, write_hf
from tests.support.saved_graphs import op_counts
from tests.support.sim_ranks import OneRank

SIZES = {  # same depth and layout, ~16x the parameters
    "narrow": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "wide": dict(hidden_size=256, intermediate_size=768, num_attention_heads=8, num_key_value_heads=2, vocab_size=4096),
}


def test_kernel_and_predictor_choice_do_not_depend_on_model_size(tmp_path, monkeypatch, caplog):
    from spmd_serve.export import export_checkpoint
    from spmd_serve.protocol import RUN, StepPlan
    from spmd_serve.worker import segment
    from spmd_serve.worker.model_runner import ModelRunner
    from spmd_serve.worker.pdiparams import read_index

    made: list[tuple] = []
    real = segment.Predictor

    def recording(rank_dir: Path, spec, paddle_threads: int, quantised: bool, params):
        made.append((spec.name, spec.params_name, paddle_threads, quantised, params is not None))
        return real(rank_dir, spec, paddle_threads, quantised, params)

    monkeypatch.setattr(segment, "Predictor", recording)
    caplog.set_level(logging.INFO, logger="spmd_serve.worker.model_runner")
    graphs, loads, params = {}, {}, {}
    for size, dims in SIZES.items():
        cfg = dict(ARCHS["llama3"], **dims)
        weights = make_weights(cfg)
        params[size] = sum(w.size for w in weights.values())
        ckpt = write_hf(tmp_path / size / "hf", cfg, weights)
        served = export_checkpoint(ckpt, tmp_path / size / "out", kv_int8=False)
        graphs[size] = op_counts(served / "rank_0" / "seg_0.json")
        made.clear()
        runner = ModelRunner(served, 0, OneRank(), num_blocks=8, block_size=16, num_threads=2)
        loads[size] = list(made)
        # and it reads their one copy onto 2 MB pages (worker/params.py), whatever their size
        entries = read_index(served / "rank_0" / "seg_0.pdiparams")
        assert runner.params.nbytes == sum(e.nbytes for e in entries) and runner.params.huge_pages
        assert sum("parameters on 2 MB pages" in r.getMessage() for r in caplog.records) == len(loads)
        mixed = StepPlan(  # a prefill chunk next to a decode: one pass, one predictor run
            RUN,
            1,
            np.arange(5),
            np.array([0, 1, 2, 3, 7]),
            np.array([4, 1]),
            np.array([0, 7]),
            np.array([[1], [2]]),
            np.array([16, 17, 18, 19, 39]),
        )
        assert runner.execute(mixed).shape == (2, cfg["vocab_size"])
    assert params["wide"] > 15 * params["narrow"]
    assert graphs["narrow"] == graphs["wide"]  # the same ops, as often
    wide = graphs["wide"]
    # fp32 weights in the panel layout at every size (export/panels.py)
    assert wide["spmd_paged_attention"] == 2
    # every linear of a layer, and lm_head: 4 a layer + 1, two in each spmd_linear_norm_linear (export/deferred.py)
    assert wide["spmd_linear_panels"] + 2 * wide["spmd_linear_norm_linear_panels"] == 2 * 4 + 1
    # o + add + norm + gate|up, and down + add + norm + the next layer's qkv: not the first qkv (no
    # add) nor the last down (the head's norm takes it)
    assert wide["spmd_linear_norm_linear_panels"] == 2 * 2 - 1 and "spmd_norm_linear_panels" not in wide
    assert "matmul" not in graphs["wide"]
    # one plain predictor, ops threaded, bound to the rank's parameters
    assert loads["narrow"] == loads["wide"] == [("seg_0", "seg_0", 1, False, True)]
