"""Speculative decoding in the scheduler and block manager (issue 15): random workloads with
random drafts (some right, some wrong), tight pools that preempt, prefix caching and aborts give
every request its reference tokens, keep every block invariant, and leave each running request
holding exactly the blocks of its computed tokens after every step (rejections rolled back)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from spmd_serve.scheduler.scheduler import Scheduler
from tests.support.scheduler_harness import EOS, make_request, make_scheduler, reference
from tests.support.spec_harness import SpecFakeModel, drive, workloads


def _fn(prompt: tuple[int, ...], pos: int) -> int:
    """EOS about one time in twelve; tokens repeat with a short period so drafts can be right."""
    h = (sum(prompt) * 131 + (pos % 7) * 29 + pos // 40) % 1000
    return EOS if h % 12 == 0 else 100 + h


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_speculative_workloads_give_the_reference_tokens(workload):
    cfg, reqs, aborts, model_kw = workload
    sched = Scheduler(cfg)
    aborted = drive(sched, SpecFakeModel(sched, _fn, **model_kw), reqs, aborts)
    for r in reqs:
        want, reason = reference(r, cfg.max_model_len, _fn)
        assert r.is_finished and r.block_ids == []
        if r.req_id in aborted:
            assert r.output_token_ids == want[: r.num_output_tokens]
        else:
            assert (r.output_token_ids, r.finish_reason) == (want, reason)


def test_right_drafts_cut_the_steps_and_wrong_ones_cost_none():
    steps = {}
    for accuracy in (0.0, 1.0):
        sched = make_scheduler(max_model_len=512)
        model = SpecFakeModel(sched, _fn, k=4, accuracy=accuracy)
        req = make_request("a", prompt_len=5, max_tokens=60, ignore_eos=True)
        drive(sched, model, [req], {})
        assert (req.output_token_ids, req.finish_reason) == reference(req, 512, _fn)
        steps[accuracy] = model.drafted, model.accepted
    assert steps[0.0][1] == 0
    assert steps[1.0][0] == steps[1.0][1] > 0  # every draft accepted: ~5 tokens per step


def test_drafts_never_pass_max_tokens_and_a_stop_drops_the_rest():
    sched = make_scheduler(max_model_len=512)
    req = make_request("b", prompt_len=4, max_tokens=3, ignore_eos=True)
    model = SpecFakeModel(sched, _fn, k=5, accuracy=1.0)
    sched.add_request(req)
    sched.update(out := sched.schedule(), model.step(out))  # the prefill
    model.propose()
    out = sched.schedule()
    assert out.seqs[0].num_draft <= 1  # 2 tokens left to output: 1 draft + the target's
    sched.update(out, model.step(out))
    assert req.is_finished and req.num_output_tokens == 3 and req.finish_reason == "length"


def test_drafts_are_dropped_rather_than_preempting_anyone():
    sched = make_scheduler(num_blocks=4, block_size=2, max_model_len=64)
    a, b = make_request("a", prompt_len=3, max_tokens=4), make_request("b", prompt_len=3, max_tokens=4)
    sched.add_request(a)
    sched.add_request(b)
    model = SpecFakeModel(sched, _fn, k=4, accuracy=1.0)
    sched.update(out := sched.schedule(), model.step(out))  # both prefilled: 4 blocks of 2 in use
    a.draft_token_ids = [7, 7, 7, 7]
    out = sched.schedule()
    assert not out.preempted and a.draft_token_ids == [] and all(s.num_draft == 0 for s in out.seqs)
