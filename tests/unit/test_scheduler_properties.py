"""Property tests: random workloads (arrivals, lengths, aborts, tiny pools, watermarks, eos)
driven to completion keep every block-ownership invariant and give every request its reference output."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import QueueFullError, Scheduler, SchedulerConfig
from tests.support.scheduler_harness import EOS, FakeModel, reference


def _hash_fn(prompt: tuple[int, ...], pos: int) -> int:
    """EOS roughly one time in ten, otherwise a prompt-and-position dependent token."""
    h = (sum(prompt) * 131 + len(prompt) * 7 + pos * 29) % 1000
    return EOS if h % 10 == 0 else 100 + h


@st.composite
def workloads(draw, pressure: bool):
    """Random configs and requests.  `pressure` packs big requests into a pool sized for about
    one of them, all at once and with no watermark, so that most examples preempt."""
    block_size = draw(st.integers(1, 4))
    max_model_len = draw(st.integers(6, 24) if pressure else st.integers(2, 24))
    specs = []  # (arrival step, total tokens, abort step)
    for _ in range(draw(st.integers(2 if pressure else 1, 8))):
        if pressure:
            total = draw(st.integers(max_model_len // 2, max_model_len))
        else:  # a third of these may be longer than max_model_len, to exercise rejection
            total = draw(
                st.integers(2, max_model_len) | st.integers(2, max_model_len) | st.integers(2, max_model_len + 3)
            )
        specs.append(
            (draw(st.integers(0, 1 if pressure else 4)), total, draw(st.none() | st.none() | st.integers(0, 30)))
        )
    # The pool is sized around the largest request; a little short, the largest are rejected.
    biggest = -(-max(min(t, max_model_len) for _, t, _ in specs) // block_size)
    slack = draw(st.integers(0, 2) if pressure else st.integers(-1, 3))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(2 if pressure else 1, 5)),
        num_blocks=max(1, biggest + slack),
        block_size=block_size,
        block_ratio=1.0 if pressure else draw(st.sampled_from([0.1, 0.6, 1.0])),
        max_waiting=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1, 12)),
        max_model_len=max_model_len,
    )
    reqs = []
    for i, (arrival, total, abort_at) in enumerate(specs):
        prompt_len = draw(st.integers(1, total - 1))
        max_tokens = total - prompt_len
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=draw(st.integers(1, max_tokens)),
            ignore_eos=pressure or draw(st.booleans()),
        )
        prompt = draw(st.lists(st.integers(100, 200), min_size=prompt_len, max_size=prompt_len))
        reqs.append((arrival, Request(f"r{i}", prompt, params, frozenset({EOS})), abort_at))
    return cfg, reqs


def check_workload(cfg: SchedulerConfig, reqs: list[tuple[int, Request, int | None]]) -> int:
    """Drive to completion checking invariants every step; return the number of preemptions."""
    sched = Scheduler(cfg)
    model = FakeModel(sched, _hash_fn)
    arrivals: dict[int, list[Request]] = {}
    for arrive, r, _ in reqs:
        arrivals.setdefault(arrive, []).append(r)
    accepted, aborted, step = [], set(), 0
    while sched.has_unfinished() or any(k >= step for k in arrivals):
        assert step < 5_000, "no progress"
        for r in arrivals.get(step, []):
            total = r.num_prompt_tokens + r.params.max_tokens
            too_big = total > cfg.max_model_len or -(-total // cfg.block_size) > cfg.num_blocks
            full = sched.num_waiting >= cfg.max_waiting
            try:
                sched.add_request(r)
            except ValueError:
                assert too_big
            except QueueFullError:
                assert full and not too_big
            else:
                assert not (too_big or full)
                accepted.append(r)
        for _, r, abort_at in reqs:
            if abort_at == step and sched.abort_request(r.req_id) is not None:
                aborted.add(r.req_id)
        out = sched.schedule()
        sched.update(out, model.step(out))
        sched.check_invariants()
        step += 1
    assert sched.block_manager.num_free_blocks == cfg.num_blocks
    for r in accepted:
        ref_out, ref_reason = reference(r, cfg.max_model_len, _hash_fn)
        assert r.is_finished and r.block_ids == []
        if r.req_id in aborted:
            assert r.finish_reason == "abort"
            assert r.output_token_ids == ref_out[: r.num_output_tokens]
        else:
            assert (r.output_token_ids, r.finish_reason) == (ref_out, ref_reason)
    return sum(r.num_preemptions for r in accepted)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(pressure=False))
def test_random_workloads_complete_correctly(workload):
    check_workload(*workload)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(pressure=True))
def test_random_workloads_under_block_pressure(workload):
    check_workload(*workload)
