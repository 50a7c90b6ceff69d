"""Scheduler scenarios driven by a fake model that also simulates the paged KV cache.

The fake model is deterministic in (prompt, position), so any schedule — chunked, preempted,
recomputed — must reproduce the token stream of a plain sequential reference loop.  It writes
(req_id, position, token) into a dict keyed by cache slot and, on every step, reads back every
position the request claims is cached: a block handed to two requests, or a stale block after
preemption, shows up as a mismatch.
"""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request, RequestStatus
from spmd_serve.scheduler.scheduler import (QueueFullError, Scheduler, SchedulerConfig,
                                            SchedulerOutput)

EOS = 1
TokenFn = Callable[[tuple[int, ...], int], int]


def default_fn(prompt: tuple[int, ...], position: int) -> int:
    """Never EOS: tokens live in [100, 1100)."""
    return 100 + (sum(prompt) * 31 + len(prompt) * 7 + position * 17) % 1000


def make_scheduler(**kw) -> Scheduler:
    cfg = dict(max_num_seqs=8, num_blocks=64, block_size=4, block_ratio=1.0, max_waiting=64,
               max_num_batched_tokens=64, max_model_len=256)
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg))


def make_request(req_id: str, prompt_len: int = 4, max_tokens: int = 4, **params) -> Request:
    base = sum(map(ord, req_id))             # distinct prompts per id => distinct streams
    prompt = [100 + (base + i) % 50 for i in range(prompt_len)]
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens, **params),
                   eos_token_ids=frozenset({EOS}))


def reference(req: Request, max_model_len: int, fn: TokenFn = default_fn) -> tuple[list[int], str]:
    """What the request must produce: sample one token per position, no scheduling at all."""
    prompt, p = tuple(req.prompt_token_ids), req.params
    out: list[int] = []
    while True:
        tok = fn(prompt, len(prompt) + len(out))
        out.append(tok)
        if tok in req.eos_token_ids and not p.ignore_eos and len(out) >= p.min_tokens:
            return out, "stop"
        if len(out) >= p.max_tokens or len(prompt) + len(out) >= max_model_len:
            return out, "length"


class FakeModel:
    def __init__(self, sched: Scheduler, fn: TokenFn = default_fn) -> None:
        self.sched, self.fn = sched, fn
        self.kv: dict[int, tuple[str, int, int]] = {}

    def step(self, out: SchedulerOutput) -> dict[str, int]:
        bm, cfg = self.sched.block_manager, self.sched.config
        assert out.num_tokens <= cfg.max_num_batched_tokens
        assert len({id(s.request) for s in out.seqs}) == len(out.seqs), "scheduled twice"
        assert not {id(r) for r in out.preempted} & {id(s.request) for s in out.seqs}
        sampled = {}
        for s in out.seqs:
            r = s.request
            assert s.num_new_tokens >= 1 and s.start == r.num_computed_tokens
            toks = r.all_token_ids
            assert s.token_ids == toks[s.start:s.start + s.num_new_tokens]
            for p in range(s.start, s.start + s.num_new_tokens):
                self.kv[bm.slot(r, p)] = (r.req_id, p, toks[p])
            for p in range(s.start + s.num_new_tokens):   # attention reads the whole prefix
                assert self.kv[bm.slot(r, p)] == (r.req_id, p, toks[p]), (r, p)
            assert s.samples == (s.start + s.num_new_tokens == r.num_tokens)
            if s.samples:
                sampled[r.req_id] = self.fn(tuple(r.prompt_token_ids), r.num_tokens)
        return sampled


def run(sched: Scheduler, arrivals: dict[int, list[Request]] | None = None,
        fn: TokenFn = default_fn, aborts: dict[int, list[str]] | None = None,
        max_steps: int = 10_000) -> list[SchedulerOutput]:
    """Drive to completion; arrivals/aborts happen before schedule() of the given step."""
    arrivals, aborts = dict(arrivals or {}), dict(aborts or {})
    model, trace, step = FakeModel(sched, fn), [], 0
    while sched.has_unfinished() or any(k >= step for k in arrivals):
        assert step < max_steps, "no progress"
        for r in arrivals.get(step, []):
            sched.add_request(r)
        for rid in aborts.get(step, []):
            sched.abort_request(rid)
        out = sched.schedule()
        sampled = model.step(out)
        sched.update(out, sampled)
        sched.check_invariants()
        trace.append(out)
        step += 1
    assert sched.block_manager.num_free_blocks == sched.config.num_blocks
    return trace


def ids(out: SchedulerOutput) -> list[str]:
    return [s.request.req_id for s in out.seqs]


def test_join_and_leave_between_steps():
    sched = make_scheduler()
    a, b = make_request("a", max_tokens=3), make_request("b", max_tokens=3)
    trace = run(sched, {0: [a], 2: [b]})
    assert [ids(o) for o in trace] == [["a"], ["a"], ["a", "b"], ["b"], ["b"]]
    assert (trace[2].seqs[1].start, trace[2].seqs[1].num_new_tokens) == (0, 4)   # b's prefill
    for r in (a, b):
        assert (r.output_token_ids, r.finish_reason) == reference(r, 256)
        assert r.status is RequestStatus.FINISHED_LENGTH and r.block_ids == []


def test_update_returns_requests_that_got_a_token_and_drops_finished():
    sched = make_scheduler(max_num_batched_tokens=6)
    a, b = make_request("a", max_tokens=1), make_request("b", prompt_len=8, max_tokens=2)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()                    # a: whole prompt; b: 2-token chunk, no sample
    got = sched.update(out, FakeModel(sched).step(out))
    assert got == [a] and a.is_finished and sched.running == [b]


def test_chunked_prefill_samples_only_on_last_chunk():
    sched = make_scheduler(max_num_batched_tokens=4)
    r = make_request("long", prompt_len=10, max_tokens=2)
    trace = run(sched, {0: [r]})
    chunks = [(s.start, s.num_new_tokens, s.samples) for o in trace for s in o.seqs]
    assert chunks == [(0, 4, False), (4, 4, False), (8, 2, True), (10, 1, True)]
    assert r.output_token_ids == reference(r, 256)[0]


def test_max_num_seqs_is_honoured_fcfs():
    sched = make_scheduler(max_num_seqs=2)
    reqs = [make_request(f"r{i}", max_tokens=3) for i in range(5)]
    trace = run(sched, {0: reqs})
    assert all(len(o.seqs) <= 2 for o in trace)
    assert ids(trace[0]) == ["r0", "r1"]
    first = {rid: next(i for i, o in enumerate(trace) if rid in ids(o)) for rid in
             (r.req_id for r in reqs)}
    assert [first[f"r{i}"] for i in range(5)] == sorted(first.values())
    assert all(len(r.output_token_ids) == 3 for r in reqs)


def test_watermark_blocks_admission_while_running_grows():
    # ratio 0.5 of 10 blocks = 5.  a takes 3 blocks for its prompt and grows to 7 in decode;
    # b (3 more blocks) would cross the mark, so it waits although the pool has room.
    sched = make_scheduler(num_blocks=10, block_size=2, block_ratio=0.5)
    a, b = make_request("a", prompt_len=6, max_tokens=8), make_request("b", prompt_len=6)
    peak = 0
    sched.add_request(a)
    sched.add_request(b)
    model = FakeModel(sched)
    while not a.is_finished:
        out = sched.schedule()
        assert ids(out) == ["a"]
        sched.update(out, model.step(out))
        peak = max(peak, sched.block_manager.num_used_blocks)
    assert peak > 5                       # running sequences are not held to the watermark
    assert ids(sched.schedule()) == ["b"]  # admitted once nothing runs


def test_tiny_block_ratio_never_deadlocks():
    sched = make_scheduler(block_ratio=0.01)
    reqs = [make_request(f"r{i}", prompt_len=9, max_tokens=3) for i in range(3)]
    trace = run(sched, {0: reqs})
    assert all(len(o.seqs) == 1 for o in trace)   # one at a time, but always progressing
    assert all(r.finish_reason == "length" for r in reqs)


def _pressured_workload() -> list[Request]:
    return [make_request(f"p{i}", prompt_len=3, max_tokens=7) for i in range(3)]


def test_preemption_recomputes_and_matches_unpressured_run():
    free_run = _pressured_workload()
    run(make_scheduler(), {0: free_run})
    # 3 requests x 10 tokens need 15 blocks of 2 at the end; the pool has 6.
    sched = make_scheduler(num_blocks=6, block_size=2)
    reqs = _pressured_workload()
    trace = run(sched, {0: reqs})
    preempted = [r.req_id for o in trace for r in o.preempted]
    assert preempted and preempted[0] == "p2"      # the youngest goes first
    for r, ref in zip(reqs, free_run):
        assert len(r.output_token_ids) == 7
        assert r.output_token_ids == ref.output_token_ids == reference(r, 256)[0]
    # After a preemption the request is replayed from position 0: prompt + tokens so far.
    victim = next(r for r in reqs if r.num_preemptions)
    seqs = [s for o in trace for s in o.seqs if s.request is victim]
    replays = [s for s in seqs[1:] if s.start == 0]
    assert replays and all(s.num_new_tokens > victim.num_prompt_tokens for s in replays)


def test_preempted_request_goes_to_front_of_waiting():
    # a and b fill the 4-block pool; c waits for a seat.  When a grows, b (youngest) is evicted
    # and must queue ahead of c, which arrived later.
    sched = make_scheduler(max_num_seqs=2, num_blocks=4, block_size=2)
    a, b, c = (make_request(x, prompt_len=3, max_tokens=4) for x in "abc")
    for r in (a, b, c):
        sched.add_request(r)
    model = FakeModel(sched)
    while True:
        out = sched.schedule()
        sched.update(out, model.step(out))
        sched.check_invariants()
        if out.preempted:
            break
    assert out.preempted == [b] and list(sched.waiting) == [b, c]
    assert b.status is RequestStatus.PREEMPTED and b.num_preemptions == 1
    assert b.num_computed_tokens == 0 and b.block_ids == [] and b.num_output_tokens == 2


def test_lone_request_never_preempts_itself_forever():
    sched = make_scheduler(num_blocks=3, block_size=2)   # exactly fits 2 + 4 tokens
    r = make_request("solo", prompt_len=2, max_tokens=4)
    run(sched, {0: [r]})
    assert r.num_preemptions == 0 and len(r.output_token_ids) == 4


def _eos_at(outputs: set[int]) -> TokenFn:
    """EOS at the given output indices (0 = first generated token), default tokens elsewhere."""
    return lambda prompt, pos: EOS if pos - len(prompt) in outputs else default_fn(prompt, pos)


@pytest.mark.parametrize("params, n_out, reason", [
    (dict(min_tokens=1), 1, "stop"),                     # first eos stops
    (dict(min_tokens=2), 3, "stop"),                     # eos at index 0 is too early
    (dict(min_tokens=2, ignore_eos=True), 6, "length"),
    (dict(min_tokens=5, max_tokens=5), 5, "stop"),       # eos as last allowed token: stop wins
])
def test_eos_with_min_tokens(params, n_out, reason):
    params.setdefault("max_tokens", 6)
    sched = make_scheduler()
    r = make_request("e", **params)
    run(sched, {0: [r]}, fn=_eos_at({0, 2, 4}))
    assert (len(r.output_token_ids), r.finish_reason) == (n_out, reason)
    assert r.output_token_ids == reference(r, 256, _eos_at({0, 2, 4}))[0]


def test_eos_only_counts_when_in_request_eos_set():
    sched = make_scheduler()
    r = Request("x", [5, 6], SamplingParams(max_tokens=3), eos_token_ids=frozenset({2}))
    run(sched, {0: [r]}, fn=_eos_at({0}))
    assert r.finish_reason == "length" and r.output_token_ids[0] == EOS


def test_max_model_len_finishes_with_length():
    sched = make_scheduler(max_model_len=8)
    r = make_request("m", prompt_len=4, max_tokens=4)
    run(sched, {0: [r]})
    assert r.num_tokens == 8 and r.finish_reason == "length"


def test_abort_frees_blocks_running_and_waiting():
    sched = make_scheduler(max_num_seqs=1)
    a, b = make_request("a", max_tokens=10), make_request("b")
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    sched.update(out, FakeModel(sched).step(out))
    assert a.block_ids and b in sched.waiting
    assert sched.abort_request("b") is b and b.status is RequestStatus.FINISHED_ABORTED
    assert sched.abort_request("a") is a and a.finish_reason == "abort"
    assert a.block_ids == [] and sched.block_manager.num_free_blocks == 64
    assert not sched.has_unfinished() and sched.abort_request("a") is None
    assert sched.abort_request("nope") is None
    sched.check_invariants()


def test_abort_between_schedule_and_update():
    sched = make_scheduler()
    a, b = make_request("a"), make_request("b")
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    sampled = FakeModel(sched).step(out)
    sched.abort_request("a")
    assert sched.update(out, sampled) == [b]
    assert a.output_token_ids == [] and a.block_ids == []
    sched.check_invariants()


def test_queue_full():
    sched = make_scheduler(max_waiting=2)
    sched.add_request(make_request("a"))
    sched.add_request(make_request("b"))
    with pytest.raises(QueueFullError):
        sched.add_request(make_request("c"))
    assert sched.num_waiting == 2


def test_too_long_and_duplicate_requests_are_rejected():
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=20)
    too_long = r"prompt\(16\) \+ max_dec_len\(5\) = 21 tokens exceeds max_model_len\(20\)"
    with pytest.raises(ValueError, match=too_long):
        sched.add_request(make_request("a", prompt_len=16, max_tokens=5))
    with pytest.raises(ValueError, match=r"17 tokens needs 5 blocks of 4.* pool of 4"):
        sched.add_request(make_request("b", prompt_len=12, max_tokens=5))
    sched.add_request(make_request("c", prompt_len=12, max_tokens=4))   # exactly the pool
    with pytest.raises(ValueError, match="already"):
        sched.add_request(make_request("c"))
    assert sched.num_waiting == 1


def test_scheduler_imports_no_heavy_dependencies():
    code = ("import sys, spmd_serve.scheduler.scheduler, spmd_serve.scheduler.block_manager, "
            "spmd_serve.scheduler.request; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'paddle', 'mpi4py', 'tornado'}); print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


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
    specs = []   # (arrival step, total tokens, abort step)
    for _ in range(draw(st.integers(2 if pressure else 1, 8))):
        if pressure:
            total = draw(st.integers(max_model_len // 2, max_model_len))
        else:   # a third of these may be longer than max_model_len, to exercise rejection
            total = draw(st.integers(2, max_model_len) | st.integers(2, max_model_len)
                         | st.integers(2, max_model_len + 3))
        specs.append((draw(st.integers(0, 1 if pressure else 4)), total,
                      draw(st.none() | st.none() | st.integers(0, 30))))
    # The pool is sized around the largest request; a little short, the largest are rejected.
    biggest = -(-max(min(t, max_model_len) for _, t, _ in specs) // block_size)
    slack = draw(st.integers(0, 2) if pressure else st.integers(-1, 3))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(2 if pressure else 1, 5)),
        num_blocks=max(1, biggest + slack), block_size=block_size,
        block_ratio=1.0 if pressure else draw(st.sampled_from([0.1, 0.6, 1.0])),
        max_waiting=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1, 12)), max_model_len=max_model_len)
    reqs = []
    for i, (arrival, total, abort_at) in enumerate(specs):
        prompt_len = draw(st.integers(1, total - 1))
        max_tokens = total - prompt_len
        params = SamplingParams(max_tokens=max_tokens, min_tokens=draw(st.integers(1, max_tokens)),
                                ignore_eos=pressure or draw(st.booleans()))
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
            assert r.output_token_ids == ref_out[:r.num_output_tokens]
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
