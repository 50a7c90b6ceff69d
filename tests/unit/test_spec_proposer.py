"""The n-gram proposer and the per-step rule (spmd_serve/engine/speculative.py)."""

from __future__ import annotations

import random

import pytest

from spmd_serve.engine.speculative import PROBE_EVERY, NgramProposer, SpecConfig, Speculator, make_speculator
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request


def decoding(req_id: str, tokens: list[int]) -> Request:
    r = Request(req_id, tokens, SamplingParams(max_tokens=100))
    r.num_computed_tokens = len(tokens) - 1  # one known token left to feed: a decode
    return r


def naive(tokens: list[int], k: int, max_ngram: int) -> list[int]:
    """The definition: the longest suffix (<= max_ngram) seen before, its latest occurrence's
    continuation."""
    last = len(tokens) - 1
    for n in range(min(max_ngram, last), 0, -1):
        suffix = tokens[last - n + 1 :]
        for end in range(last - 1, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == suffix:
                return tokens[end + 1 : end + 1 + k]
    return []


def test_ngram_drafts_follow_the_latest_longest_match():
    p = NgramProposer(3)
    r = decoding("a", [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7])
    assert p.lookup(r, 3) == [2, 6, 7]  # "6 7" last seen before "2"; "1 6 7" is not a suffix
    r.output_token_ids += [2, 6]
    assert p.lookup(r, 2) == [7, 2]  # "7 2 6" seen: the index grew with the new tokens
    assert p.lookup(decoding("b", [1, 2, 3]), 4) == []


@pytest.mark.parametrize("seed", range(20))
def test_ngram_index_matches_the_definition_as_tokens_arrive(seed):
    rng = random.Random(seed)
    p = NgramProposer(rng.randint(1, 4))
    max_ngram = p.max_ngram
    r = decoding("r", [rng.randint(0, 4) for _ in range(rng.randint(1, 6))])
    for _ in range(60):
        k = rng.randint(1, 8)
        assert p.lookup(r, k) == naive(r.all_token_ids, k, max_ngram)
        r.output_token_ids += [rng.randint(0, 4) for _ in range(rng.randint(1, 3))]


def test_requests_whose_drafts_fail_stop_drafting_but_probe_again():
    spec = Speculator(SpecConfig("ngram", num_draft=4, min_acceptance=0.3))
    good, bad = decoding("g", [1, 2, 3] * 5), decoding("b", [4, 5, 6] * 5)
    drafted = {"g": 0, "b": 0}
    for _ in range(40):
        spec.propose([good, bad])
        for r in (good, bad):
            drafted[r.req_id] += bool(r.draft_token_ids)
        spec.on_verdicts([(good, len(good.draft_token_ids), len(good.draft_token_ids)), (bad, 4, 0)])
    assert drafted["g"] == 40
    assert 40 // PROBE_EVERY - 1 <= drafted["b"] <= 40 // PROBE_EVERY + 3  # a few misses, then probes only


def test_one_proposer_call_a_step_and_probes_get_one_draft():
    """A model proposer pays k draft plans per call: the requests that draft and those that probe
    share one call, the probes keep their first draft only."""
    calls: list[tuple[list[str], int]] = []

    class Counting(NgramProposer):
        def propose(self, requests, k):
            calls.append(([r.req_id for r in requests], k))
            super().propose(requests, k)

    spec = Speculator(SpecConfig("ngram", num_draft=4, min_acceptance=0.3), Counting(3))
    good, bad = decoding("g", [1, 2, 3] * 5), decoding("b", [4, 5, 6] * 5)
    shared = 0
    for _ in range(3 * PROBE_EVERY):
        calls.clear()
        spec.propose([good, bad])
        assert len(calls) <= 1
        assert len(bad.draft_token_ids) <= 1 or not calls or calls[0][1] == 1
        if calls and calls[0] == (["g", "b"], 4):  # good drafts while bad probes: one call
            shared += 1
            assert len(good.draft_token_ids) > 1 and len(bad.draft_token_ids) == 1
        spec.on_verdicts([(good, len(good.draft_token_ids), len(good.draft_token_ids)), (bad, 1, 0)])
    assert shared >= 2


def test_prefills_get_no_drafts_and_none_means_off():
    spec = make_speculator("inference_with_reference", 2, 3)
    assert spec is not None and spec.method == "ngram" and make_speculator("none", 1, 3) is None
    r = Request("p", [1, 2, 1, 2], SamplingParams(max_tokens=4))  # nothing computed yet: a prefill
    spec.propose([r])
    assert r.draft_token_ids == []
    with pytest.raises(ValueError, match="SPECULATE_MAX_DRAFT_TOKEN_NUM"):
        SpecConfig("ngram", num_draft=9)


def test_the_speculator_settings_come_from_the_environment():
    """What the server's engine is built with (server.speculator): SPECULATE_METHOD (the alias
    too), SPECULATE_MAX_DRAFT_TOKEN_NUM, SPECULATE_MAX_NGRAM_SIZE."""
    from spmd_serve.config import load_config
    from spmd_serve.server import speculator

    assert speculator(load_config([], {})) is None
    env = {"SPECULATE_METHOD": "inference_with_reference", "SPECULATE_MAX_DRAFT_TOKEN_NUM": "3"}
    spec = speculator(load_config([], {**env, "SPECULATE_MAX_NGRAM_SIZE": "2"}))
    assert spec is not None and (spec.cfg.method, spec.cfg.num_draft, spec.cfg.max_ngram) == ("ngram", 3, 2)
    assert spec.proposer.max_ngram == 2  # type: ignore[attr-defined]
