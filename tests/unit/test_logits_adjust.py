"""A request's adjustments of its own rows before ops.sample (spmd_serve/engine/logits_adjust.py),
through the Sampler: OpenAI's logit_bias forces and bans tokens of its request only, vLLM's min_p
draws only the tokens above its share of the top one after penalties and temperature (against a
float64 reference, renormalised), and both leave greedy rows' rules and the raw logprobs alone;
vLLM's allowed_token_ids and bad_words mask only their request's tokens."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import chisquare

from spmd_serve.engine.sampler import Sampler
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput

# ---------------------------------------------------------------- logit_bias


def _step(*reqs: Request) -> SchedulerOutput:
    return SchedulerOutput([ScheduledSeq(r, 0, len(r.prompt_token_ids), True) for r in reqs])


def test_logit_bias_forces_and_bans_tokens_of_its_own_request_only():
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 2.0, (3, 50)).astype(np.float32)
    raw = logits.copy()
    best = [int(np.argmax(row)) for row in logits]
    second = int(np.argsort(-logits[1])[1])
    forced = Request("f", [1], SamplingParams(max_tokens=4, temperature=0, logit_bias=((7, 100.0),)))
    banned = Request("b", [1], SamplingParams(max_tokens=4, temperature=0, logit_bias=((best[1], -100.0),)))
    plain = Request("p", [1], SamplingParams(max_tokens=4, temperature=0, logprobs=2))
    step = Sampler().sample(_step(forced, banned, plain), logits)
    assert step.tokens == [[7], [second], [best[2]]]
    assert np.array_equal(logits, raw)  # the bias went into a copy
    # sampled too: +100 outweighs any spread of these logits, at any temperature
    hot = Request("h", [1], SamplingParams(max_tokens=4, temperature=1.5, seed=3, logit_bias=((7, 100.0), (9, -5.0))))
    assert Sampler().sample(_step(hot), logits[:1]).tokens == [[7]]


def test_logit_bias_leaves_the_logprobs_raw():
    logits = np.log(np.array([[0.5, 0.3, 0.2]], np.float32))
    req = Request("r", [1], SamplingParams(max_tokens=4, temperature=0, logprobs=1, logit_bias=((2, 100.0),)))
    step = Sampler().sample(_step(req), logits)
    chosen, top = step.logprobs["r"][0]
    assert step.tokens == [[2]] and chosen == pytest.approx(math.log(0.2), abs=1e-6)
    assert top[0][0] == 0  # the model's own favourite, not the biased token


@pytest.mark.parametrize(
    "bias,msg",
    [(((3, 1.0), (3, 2.0)), "distinct"), (((5, 1.0), (3, 2.0)), "ascending"), (((-1, 1.0),), "token ids"),
     (((3, 101.0),), "100"), (((3, float("nan")),), "100")],
)  # fmt: skip
def test_logit_bias_outside_its_bounds_is_refused(bias, msg):
    with pytest.raises(ValueError, match=f"logit_bias.*{msg}"):
        SamplingParams(logit_bias=bias).validate()


# ---------------------------------------------------------------- min_p


def _min_p_kept(x: np.ndarray, temperature: float, min_p: float) -> set[int]:
    """float64 reference: vLLM's rule, p_i >= min_p * p_max of softmax(x / T)."""
    z = x.astype(np.float64) / temperature
    prob = np.exp(z - z.max())
    return {int(i) for i in np.flatnonzero(prob >= min_p * prob.max())}


def _draws(logits: np.ndarray, params: SamplingParams, seeds: int, output: list[int] | None = None) -> np.ndarray:
    reqs = []
    for seed in range(seeds):
        r = Request(f"r{seed}", [1], dataclasses.replace(params, seed=seed))
        r.output_token_ids = list(output or [])
        reqs.append(r)
    step = Sampler().sample(_step(*reqs), np.repeat(logits[None, :], seeds, axis=0))
    return np.array([t[0] for t in step.tokens])


@pytest.mark.parametrize("temperature,min_p,top_k", [(1.0, 0.1, 0), (0.7, 0.3, 0), (1.5, 0.05, 3)])
def test_min_p_draws_only_tokens_above_its_share_of_the_top(temperature, min_p, top_k):
    x = np.random.default_rng(5).normal(0, 1.5, 12).astype(np.float32)
    params = SamplingParams(max_tokens=4, temperature=temperature, min_p=min_p, top_k=top_k)
    counts = np.bincount(_draws(x, params, 2000), minlength=12)
    kept = _min_p_kept(x, temperature, min_p)
    if top_k:
        kept &= set(np.argsort(-x)[:top_k].tolist())
    assert set(np.flatnonzero(counts)) == kept  # every kept token drawn, no other
    z = x[sorted(kept)].astype(np.float64) / temperature
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum() * counts.sum()
    assert chisquare(counts[sorted(kept)], want).pvalue > 1e-3  # the kept tokens, renormalised


def test_min_p_is_taken_after_the_penalties():
    # token 0 leads the raw logits but was generated: repetition 5 turns 5.0 into 1.0, so token 1 leads
    x = np.array([5.0, 4.0, 3.5, 0.0], np.float32)
    params = SamplingParams(max_tokens=8, temperature=1.0, min_p=0.5, repetition_penalty=5.0)
    drawn = set(_draws(x, params, 400, output=[0]).tolist())
    assert drawn == {1, 2}  # exp(3.5 - 4) = 0.61 >= 0.5 stays; token 0 (exp(-3)) goes


def test_min_p_leaves_greedy_rows_and_the_raw_logprobs_alone():
    x = np.array([[1.0, 3.0, 2.9, -1.0]], np.float32)
    greedy = Request("g", [1], SamplingParams(max_tokens=4, temperature=0, min_p=0.99, logprobs=2))
    step = Sampler().sample(_step(greedy), x)
    assert step.tokens == [[1]] and [t for t, _ in step.logprobs["g"][0][1]] == [1, 2]
    hot = Request("h", [1], SamplingParams(max_tokens=4, temperature=1.0, min_p=0.95, seed=1, logprobs=1))
    step = Sampler().sample(_step(hot), x)
    lse = np.log(np.exp(x[0].astype(np.float64)).sum())
    assert step.tokens == [[1]] and step.logprobs["h"][0][0] == pytest.approx(3.0 - lse, abs=1e-6)


# ---------------------------------------------------------------- allowed_token_ids


def test_allowed_token_ids_limit_every_draw_and_no_bias_revives_the_rest():
    x = np.random.default_rng(8).normal(0, 2.0, 12).astype(np.float32)
    allowed = (2, 5, 9)
    params = SamplingParams(max_tokens=4, temperature=1.3, allowed_token_ids=allowed, logit_bias=((0, 100.0),))
    assert set(_draws(x, params, 500).tolist()) == set(allowed)  # each drawn, nothing else
    greedy = Request("g", [1], SamplingParams(max_tokens=4, temperature=0, allowed_token_ids=allowed))
    assert Sampler().sample(_step(greedy), x[None, :]).tokens == [[max(allowed, key=lambda i: x[i])]]
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=(5, 2)).validate()


def test_allowed_ids_that_min_tokens_masks_fail_that_request_alone():
    x = np.zeros((2, 8), np.float32)
    stuck = Request("s", [1], SamplingParams(max_tokens=4, min_tokens=2, temperature=0, allowed_token_ids=(5,)))
    stuck.eos_token_ids = frozenset({5})
    other = Request("o", [1], SamplingParams(max_tokens=4, temperature=0))
    step = Sampler().sample(_step(stuck, other), x)
    assert "allowed_token_ids" in step.failed["s"] and step.token_by_request() == {"o": [0]}


# ---------------------------------------------------------------- bad_words


def test_bad_words_ban_a_sequence_s_last_token_only_after_the_rest_of_it():
    """vLLM's apply_bad_words: a one-token word is never drawn; a longer one's last token is masked
    only where the output ends with the tokens before it (the prompt does not count)."""
    x = np.array([0.0, 5.0, 4.0, 3.0, 2.0, 1.0], np.float32)  # greedy order: 1, 2, 3, 4, 5, 0
    banned = ((1,), (0, 2), (4, 3, 2))  # 1 always; 2 after 0; 2 after 4, 3

    def greedy(output: list[int], prompt: list[int] | None = None) -> int:
        r = Request("g", prompt or [1], SamplingParams(max_tokens=4, temperature=0, bad_words=banned, logprobs=1))
        r.output_token_ids = list(output)
        step = Sampler().sample(_step(r), x[None, :])
        assert step.logprobs["g"][0][0] == pytest.approx(float(x[step.tokens[0][0]] - np.log(np.exp(x).sum())))
        return step.tokens[0][0]

    assert greedy([]) == 2 and greedy([3]) == 2  # 1 banned; 2 free
    assert greedy([0]) == 3 and greedy([5, 4, 3]) == 3  # 2 banned after 0, and after 4, 3
    assert greedy([3, 3]) == 2 and greedy([], prompt=[4, 3]) == 2  # not after 3, 3; the prompt's tail is not output
    hot = SamplingParams(max_tokens=4, temperature=2.0, bad_words=banned)
    assert set(_draws(x, hot, 300, output=[0]).tolist()) == {0, 3, 4, 5}  # each other one drawn, never 1 or 2


def test_bad_words_bounds_and_a_ban_of_every_allowed_token_are_refused():
    for bad in [((),), ((1,),) * 129, ((1,) * 65,), ((-1,),)]:
        with pytest.raises(ValueError, match="bad_words must be at most 128 sequences of 1 to 64 token ids"):
            SamplingParams(bad_words=bad).validate()
    with pytest.raises(ValueError, match="bad_words ban every token allowed_token_ids allows"):
        SamplingParams(allowed_token_ids=(2, 5), bad_words=((5,), (2,))).validate()
    SamplingParams(allowed_token_ids=(2, 5), bad_words=((5,), (3, 2))).validate()  # 2 is free after other tokens


def test_bad_words_that_mask_every_allowed_token_fail_that_request_alone():
    x = np.zeros((2, 8), np.float32)
    stuck = Request(
        "s", [1], SamplingParams(max_tokens=4, temperature=0, allowed_token_ids=(5, 6), bad_words=((3, 5), (3, 6)))
    )
    stuck.output_token_ids = [3]
    other = Request("o", [1], SamplingParams(max_tokens=4, temperature=0))
    step = Sampler().sample(_step(stuck, other), x)
    assert "bad_words" in step.failed["s"] and step.token_by_request() == {"o": [0]}


# ---------------------------------------------------------------- guided_choice

CHOICES = ((3, 4), (3, 5, 6), (7,), (7, 8))  # token sequences; eos 9


def _guided(output: list[int], x: np.ndarray, temperature: float = 0.0, seed: int = 0) -> int:
    r = Request("c", [1], SamplingParams(max_tokens=8, temperature=temperature, seed=seed, guided_sequences=CHOICES))
    r.output_token_ids, r.eos_token_ids = list(output), frozenset({9})
    step = Sampler().sample(_step(r), x[None, :])
    assert not step.failed, step.failed
    return step.tokens[0][0]


def test_guided_choice_keeps_every_answer_on_a_choice_then_ends_it():
    """Only the next ids of the choices the output is a prefix of are drawn, and an eos once it is
    a whole one (both where a longer choice extends it), whatever the model prefers."""
    rng = np.random.default_rng(5)
    seen = set()
    for trial in range(60):
        x = rng.normal(0, 3.0, 12).astype(np.float32)
        out: list[int] = []
        while not out or out[-1] != 9:
            out.append(_guided(out, x, temperature=1.0, seed=trial))
            assert len(out) <= 4
        assert tuple(out[:-1]) in CHOICES
        seen.add(tuple(out[:-1]))
    assert seen == set(CHOICES)  # each reached: (3, 4) and (7,) end by eos, (7, 8) past a whole one
    x = np.arange(12, dtype=np.float32)  # the model prefers 11, then 10, ...: greedy takes the best allowed
    assert [_guided([], x), _guided([7], x), _guided([3], x), _guided([3, 5], x), _guided([3, 4], x)] == [7, 9, 5, 6, 9]


def _step_at(r: Request, num_draft: int) -> SchedulerOutput:
    return SchedulerOutput([ScheduledSeq(r, r.num_tokens - 1, 1, True, num_draft=num_draft)])


def test_guided_choice_drafts_verify_as_plain_decoding():
    """A verified draft position is held to the choices by the output before it, drafts included."""
    rng = np.random.default_rng(9)
    for trial in range(50):
        logits = rng.normal(0, 2.0, (3, 12)).astype(np.float32)
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=trial, guided_sequences=CHOICES)
        plain = [3]
        for j in range(3):  # plain decoding, one position a step
            r = Request("c", [1, 2, 3], params, eos_token_ids=frozenset({9}))
            r.output_token_ids = list(plain)
            plain += Sampler().sample(_step_at(r, 0), logits[j : j + 1]).tokens[0]
            if plain[-1] == 9:
                break
        r = Request("c", [1, 2, 3], params, eos_token_ids=frozenset({9}))
        r.output_token_ids, r.draft_token_ids = [3], [5, 6]
        got = Sampler().sample(SchedulerOutput([ScheduledSeq(r, 3, 3, True, num_draft=2)]), logits).tokens[0]
        assert got == plain[1 : 1 + len(got)]


def test_guided_choice_that_other_masks_leave_nothing_fails_that_request_alone():
    x = np.zeros((2, 12), np.float32)
    stuck = Request(
        "s", [1], SamplingParams(max_tokens=4, temperature=0, guided_sequences=CHOICES, bad_words=((3,), (7,)))
    )
    stuck.eos_token_ids = frozenset({9})
    other = Request("o", [1], SamplingParams(max_tokens=4, temperature=0))
    step = Sampler().sample(_step(stuck, other), x)
    assert "guided_choice" in step.failed["s"] and step.token_by_request() == {"o": [0]}
    with pytest.raises(ValueError, match="not with ignore_eos or min_tokens"):
        SamplingParams(guided_sequences=CHOICES, ignore_eos=True).validate()
