"""The CPU sampler's C steps (ops/cpu_kernels/sample_draw.cc through ops/sample_native.py) against the
numpy twin they replace on a CPU server: the same bits for every output of `sample_cpu` on random
batches that turn every switch (greedy rows, top-k, top-p, penalties, min_tokens masking, logprobs),
on flat, peaked, tied, masked and large-vocabulary rows, and the exp2 weights on a dense sweep of
float32 values (the C code must round each float32 operation as numpy does: no contraction).  The
rows without top-k / top-p and without top logprobs (the engine's usual call) take the C draw's own
path (a weighted select in the bucket holding the draw); the others its port of the twin's loop."""

from __future__ import annotations

import numpy as np
import pytest

from ops import sample as sp
from ops import sample_twin
from tests.support.ops_sample_reference import base_batch, make_batch


@pytest.fixture(scope="module")
def native():
    from ops import paddle_ext, sample_native

    paddle_ext.load()
    steps = sample_native.kernels()
    assert steps is not None  # the library is loaded: the engine's rank 0 gets them the same way
    return steps


def test_exp2_weights_are_the_twin_s_bit_for_bit(native) -> None:
    d = np.concatenate(
        [
            -np.linspace(0, 40, 3_000_001, dtype=np.float64).astype(np.float32),
            np.float32([0.0, -0.0, -22.87, -22.88, -1e-30, -np.inf, np.nan, -3.4e38]),
            -np.random.default_rng(0).exponential(5.0, 200_000).astype(np.float32),
        ]
    )
    np.testing.assert_array_equal(native.exp2_weight(d), sample_twin.exp2_weight(d))


def _same(batch: dict, n_top: int, native) -> None:
    want = sp.sample_cpu(**batch, num_logprobs=n_top)
    got = sp.sample_cpu(**batch, num_logprobs=n_top, native=native)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("v_sz, scale", [(7, 3.0), (50, 0.3), (1000, 3.0), (4096, 8.0), (32000, 2.0)])
@pytest.mark.parametrize("n_top", [0, 3])
def test_random_batches_sample_the_same_bits(native, v_sz, scale, n_top) -> None:
    rng = np.random.default_rng(v_sz + n_top)
    for _ in range(6):
        _same(make_batch(rng, 24, v_sz, scale=scale), n_top, native)


def test_edge_rows_sample_the_same_bits(native) -> None:
    rng = np.random.default_rng(5)
    flat = np.zeros((8, 300), np.float32)  # all tied: ranks by id alone
    ties = np.round(rng.standard_normal((8, 300)) * 2).astype(np.float32)  # few distinct values
    masked = rng.standard_normal((8, 300)).astype(np.float32)
    masked[:, ::3] = -np.inf
    signed_zeros = np.where(rng.random((8, 300)) < 0.5, np.float32(-0.0), np.float32(0.0))
    big = (rng.standard_normal((2, 150_000)) * 4).astype(np.float32)
    for logits in (flat, ties, masked, signed_zeros, big):
        for over in ({}, {"top_p": 0.5}, {"top_k": 5}, {"top_p": 0.9, "top_k": 40}, {"temperature": 0.05}):
            batch = base_batch(logits, **over)
            batch["counters"] = rng.integers(0, 2**40, len(logits)).astype(np.int64)
            for n_top in (0, 4):  # 0: the engine's call, whose default rows take the bucket draw
                _same(batch, n_top, native)
