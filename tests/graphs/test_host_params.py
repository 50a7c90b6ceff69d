"""worker/params.py: a rank reads each parameter file once and binds it into every predictor that
uses it.  The predictors are made from a one-element skeleton of the file, so Paddle's passes never
saw the real values: the logits must be those of predictors that loaded the file themselves, for
every kind of graph we export (C++ ops, Paddle's ops, weight-only int8/int4, DeepSeek's base and
decode graphs), and a DeepSeek segment's two graphs must share one copy."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.sim_ranks import OneRank

CASES = {  # demo preset, export options
    "llama-cpp-ops": ("tiny", dict(graph_ops="cpp")),
    "llama-paddle-ops": ("tiny", dict(graph_ops="paddle")),
    "llama-int4": ("tiny", dict(graph_ops="cpp", quant="weight_only_int4")),
    "llama-int8-paddle-ops": ("tiny", dict(graph_ops="paddle", quant="weight_only_int8")),
    "deepseek": ("deepseek-tiny", dict(graph_ops="cpp")),
}


def plans() -> list:
    """Two prompts (4 and 3 tokens) prefilled in one step, then two decode steps of both."""
    from spmd_serve.protocol import RUN, StepPlan

    i64 = lambda *x: np.array(x, np.int64)  # noqa: E731
    steps = [StepPlan(RUN, 1, i64(5, 9, 2, 7, 3, 8, 1), i64(0, 1, 2, 3, 0, 1, 2), i64(4, 3), i64(0, 0),
                      i64([1], [2]), i64(16, 17, 18, 19, 32, 33, 34))]  # fmt: skip
    for s, (a, b) in enumerate([(11, 12), (13, 14)]):
        steps.append(
            StepPlan(
                RUN,
                2 + s,
                i64(a, b),
                i64(4 + s, 3 + s),
                i64(1, 1),
                i64(4 + s, 3 + s),
                i64([1], [2]),
                i64(20 + s, 35 + s),
            )  # fmt: skip
        )
    return steps


def run(served, **kw) -> list[np.ndarray]:
    from spmd_serve.worker.model_runner import ModelRunner

    runner = ModelRunner(served, 0, OneRank(), num_blocks=4, block_size=16, num_threads=2, **kw)
    return [runner.execute(p) for p in plans()]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from spmd_serve.export import export_checkpoint
    from spmd_serve.export.demo.checkpoint import write_demo_checkpoint

    root = tmp_path_factory.mktemp("host_params")
    ckpts = {p: write_demo_checkpoint(root / p, p) for p in {p for p, _ in CASES.values()}}
    return {k: export_checkpoint(ckpts[p], root / k, kv_int8=False, **kw) for k, (p, kw) in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_bound_parameters_give_the_logits_of_paddles_own_load(case, exported, monkeypatch):
    from spmd_serve.worker import segment

    served = exported[case]
    ours = run(served)
    real = segment.Predictor
    monkeypatch.setattr(segment, "Predictor", lambda *a: real(*a[:-1], None))  # Paddle loads its own copy
    theirs = run(served)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape and np.isfinite(a).all()
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    if case == "deepseek":  # the decode steps ran its decode graph, the first step its base graph
        assert served.joinpath("rank_0", "seg_0.dec.json").exists()


def test_a_deepseek_segments_two_graphs_share_one_copy(exported) -> None:
    from spmd_serve.worker.model_runner import ModelRunner
    from spmd_serve.worker.pdiparams import graph_params, read_index

    rank = exported["deepseek"] / "rank_0"
    file = rank / "seg_0.pdiparams"
    runner = ModelRunner(rank.parent, 0, OneRank(), num_blocks=4, block_size=16)
    seg = runner.segments[0]
    assert seg.decode is not None
    entries = read_index(file)
    assert runner.params.nbytes == sum(e.nbytes for e in entries)  # the file's tensors, once
    arrays = runner.params.arrays(file)
    k = max(range(len(arrays)), key=lambda i: arrays[i].size)
    arrays[k] += 1  # changed in the rank's copy: both graphs see it, so neither holds its own
    for pred, program in ((seg.predictor, "seg_0.json"), (seg.decode, "seg_0.dec.json")):
        name = graph_params(rank / program, entries)[k]
        np.testing.assert_array_equal(pred.predictor.get_input_handle(name).copy_to_cpu(), arrays[k])
    assert not set(graph_params(rank / "seg_0.json", entries)) & set(seg.inputs)  # bound, never fed


def test_the_predictors_keep_the_parameters_memory_alive(exported) -> None:
    import gc

    from spmd_serve.worker.model_runner import ModelRunner

    runner = ModelRunner(exported["llama-cpp-ops"], 0, OneRank(), num_blocks=4, block_size=16)
    want = runner.execute(plans()[0])
    runner.params = None  # the predictors' references alone keep the mappings (else: a segfault here)
    gc.collect()
    np.testing.assert_array_equal(runner.execute(plans()[0]), want)
