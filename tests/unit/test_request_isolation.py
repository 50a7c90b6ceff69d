"""An error that belongs to one request fails that request only (issue 17 item 0): the real Engine
loop with fake ranks ends it with an error output, frees its blocks, and goes on stepping every
other request; the loop itself never stops over it."""

from __future__ import annotations

import time

import pytest

import spmd_serve.engine.sampler as sampler_module
from spmd_serve.sampling_params import SamplingParams
from tests.support.engine_rig import engine_rig

N = 6  # tokens each request asks for


@pytest.fixture
def rig():
    yield from engine_rig(0.002)


def params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=N, min_tokens=N, temperature=0.0, **kw)


def run_pair(rig, bad_params: SamplingParams):
    """A good and a bad request submitted together; both read to their end."""
    start, client, io, _ = rig
    eng = start()
    good = io.call(client.add_request, "good", [5, 6, 7], params())
    bad = io.call(client.add_request, "bad", [5, 6, 7], bad_params)
    outs_bad, outs_good = io.read_all(bad), io.read_all(good)
    return eng, outs_good, outs_bad


def assert_isolated(eng, outs_good, outs_bad, status: int, words: str) -> None:
    last = outs_bad[-1]
    assert (last.finish_reason, last.error_code) == ("error", status) and words in last.error_msg
    assert sum(len(o.new_token_ids) for o in outs_good) == N and outs_good[-1].finish_reason == "length"
    bm = eng.scheduler.block_manager
    deadline = time.monotonic() + 5
    while eng.scheduler.has_unfinished() or bm.num_free_blocks != bm.num_blocks:
        assert time.monotonic() < deadline, "a failed request kept its blocks"
        time.sleep(0.01)


def test_parameters_that_escaped_the_parser_are_refused_at_admission(rig):
    # eos 2**64 once overflowed the sampler's int array on rank 0 and MPI_Abort-ed every rank
    eng, good, bad = run_pair(rig, params(eos_token_ids=(2**64,)))
    assert_isolated(eng, good, bad, 400, "eos_token_ids")
    assert len(bad) == 1 and not bad[0].new_token_ids


def test_a_request_whose_sampling_raises_fails_alone(rig, monkeypatch):
    real = sampler_module.sample

    def sample(logits, requests):
        if any(r.req_id == "bad" for r in requests):
            raise ValueError("this row cannot be sampled")
        return real(logits, requests)

    monkeypatch.setattr(sampler_module, "sample", sample)
    eng, good, bad = run_pair(rig, params())
    assert_isolated(eng, good, bad, 500, "this row cannot be sampled")
    assert eng.metrics.success["abort"]._value.get() == 1


def test_a_token_outside_the_vocabulary_fails_its_request_before_any_graph_sees_it(rig, monkeypatch):
    real = sampler_module.sample

    def sample(logits, requests):
        return [logits.shape[-1] if r.req_id == "bad" else t for r, t in zip(requests, real(logits, requests))]

    monkeypatch.setattr(sampler_module, "sample", sample)
    eng, good, bad = run_pair(rig, params())
    assert_isolated(eng, good, bad, 500, "outside the vocabulary")
    assert max(int(p.input_ids.max()) for p in rig[3].plans if p.num_tokens) < 32  # FakeRunner's vocab
