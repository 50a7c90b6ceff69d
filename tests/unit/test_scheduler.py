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

import pytest

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request, RequestStatus
from spmd_serve.scheduler.scheduler import QueueFullError
from tests.support.scheduler_harness import (
    EOS,
    FakeModel,
    TokenFn,
    default_fn,
    ids,
    make_request,
    make_scheduler,
    reference,
    run,
)


def test_join_and_leave_between_steps():
    sched = make_scheduler()
    a, b = make_request("a", max_tokens=3), make_request("b", max_tokens=3)
    trace = run(sched, {0: [a], 2: [b]})
    assert [ids(o) for o in trace] == [["a"], ["a"], ["a", "b"], ["b"], ["b"]]
    assert (trace[2].seqs[1].start, trace[2].seqs[1].num_new_tokens) == (0, 4)  # b's prefill
    for r in (a, b):
        assert (r.output_token_ids, r.finish_reason) == reference(r, 256)
        assert r.status is RequestStatus.FINISHED_LENGTH and r.block_ids == []


def test_update_returns_requests_that_got_a_token_and_drops_finished():
    sched = make_scheduler(max_num_batched_tokens=6)
    a, b = make_request("a", max_tokens=1), make_request("b", prompt_len=8, max_tokens=2)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()  # a: whole prompt; b: 2-token chunk, no sample
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
    first = {rid: next(i for i, o in enumerate(trace) if rid in ids(o)) for rid in (r.req_id for r in reqs)}
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
    assert peak > 5  # running sequences are not held to the watermark
    assert ids(sched.schedule()) == ["b"]  # admitted once nothing runs


def test_tiny_block_ratio_never_deadlocks():
    sched = make_scheduler(block_ratio=0.01)
    reqs = [make_request(f"r{i}", prompt_len=9, max_tokens=3) for i in range(3)]
    trace = run(sched, {0: reqs})
    assert all(len(o.seqs) == 1 for o in trace)  # one at a time, but always progressing
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
    assert preempted and preempted[0] == "p2"  # the youngest goes first
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
    sched = make_scheduler(num_blocks=3, block_size=2)  # exactly fits 2 + 4 tokens
    r = make_request("solo", prompt_len=2, max_tokens=4)
    run(sched, {0: [r]})
    assert r.num_preemptions == 0 and len(r.output_token_ids) == 4


def _eos_at(outputs: set[int]) -> TokenFn:
    """EOS at the given output indices (0 = first generated token), default tokens elsewhere."""
    return lambda prompt, pos: EOS if pos - len(prompt) in outputs else default_fn(prompt, pos)


@pytest.mark.parametrize(
    "params, n_out, reason",
    [
        (dict(min_tokens=1), 1, "stop"),  # first eos stops
        (dict(min_tokens=2), 3, "stop"),  # eos at index 0 is too early
        (dict(min_tokens=2, ignore_eos=True), 6, "length"),
        (dict(min_tokens=5, max_tokens=5), 5, "stop"),  # eos as last allowed token: stop wins
    ],
)
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
    sched.add_request(make_request("c", prompt_len=12, max_tokens=4))  # exactly the pool
    with pytest.raises(ValueError, match="already"):
        sched.add_request(make_request("c"))
    assert sched.num_waiting == 1


def test_scheduler_imports_no_heavy_dependencies():
    code = (
        "import sys, spmd_serve.scheduler.scheduler, spmd_serve.scheduler.block_manager, "
        "spmd_serve.scheduler.request; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'paddle', 'mpi4py', 'tornado'}); print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_token_ids_between_is_a_slice_of_all_token_ids():
    """Every [start, end) across the prompt/output boundary, empty ranges and the ends included."""
    r = Request("r", [5, 6, 7], SamplingParams(max_tokens=8))
    r.output_token_ids += [8, 9]
    for start in range(6):
        for end in range(start, 7):
            assert r.token_ids_between(start, end) == r.all_token_ids[start:end], (start, end)
