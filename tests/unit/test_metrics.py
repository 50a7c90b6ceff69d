"""Engine metrics (CONTRACT.md §6) without MPI: the definitions in spmd_serve/engine/metrics.py
checked step by step against a real Scheduler and a fake clock (the real Engine loop and the
`/metrics` service over a socket are in tests/http/test_metrics_endpoint.py).  Every scrape goes
through prometheus_client's own text parser."""

from __future__ import annotations

import sys
import threading

import pytest

from spmd_serve.engine.metrics import EngineMetrics, SchedulerGauges
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from tests.support.metrics_scrape import Samples
from tests.support.scheduler_harness import FakeModel, make_scheduler


class Clock:
    def __init__(self, t: float = 1.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def step(sched, model: FakeModel, m: EngineMetrics, clock: Clock, step_s: float = 0.5) -> list[Request]:
    """One engine step in the engine's order (schedule, run for step_s, update), then the gauges."""
    out = sched.schedule()
    assert not out.is_empty
    m.on_schedule(out)
    clock.t += step_s
    done = sched.update(out, model.step(out))
    m.on_update(done)
    m.update_gauges(sched)
    return done


def req(req_id: str, prompt_len: int, max_tokens: int, arrival: float = 0.0) -> Request:
    return Request(
        req_id, [100 + i for i in range(prompt_len)], SamplingParams(max_tokens=max_tokens), arrival_time=arrival
    )


def run_all(sched, m: EngineMetrics, clock: Clock) -> None:
    model = FakeModel(sched)
    while sched.has_unfinished():
        step(sched, model, m, clock)


def test_counters_and_latencies_follow_the_definitions():
    sched, clock = make_scheduler(), Clock(1.0)
    m = EngineMetrics(clock=clock)
    sched.add_request(req("a", 4, 3, arrival=0.0))
    sched.add_request(req("b", 6, 2, arrival=0.5))
    run_all(sched, m, clock)
    # both scheduled at t=1.0; tokens at t=1.5, 2.0 (b ends), 2.5 (a ends)
    s = Samples.of(m.registry)
    assert s.get("prompt_tokens_total") == 10 and s.get("generation_tokens_total") == 5
    assert s.get("engine_steps_total") == 3 and s.get("num_preemptions_total") == 0
    assert s.get("request_success_total", finished_reason="length") == 2
    assert s.get("request_success_total", finished_reason="stop") == 0  # present before it happens
    assert s.get("request_success_total", finished_reason="abort") == 0
    hist = {
        "time_to_first_token_seconds": (2, 1.5 + 1.0),
        "inter_token_latency_seconds": (3, 1.5),
        "e2e_request_latency_seconds": (2, 2.5 + 1.5),
        "request_queue_time_seconds": (2, 1.0 + 0.5),
    }
    for name, (count, total) in hist.items():
        assert (s.get(name + "_count"), s.get(name + "_sum")) == pytest.approx((count, total)), name
    assert s.get("time_to_first_token_seconds_bucket", le="1.0") == 1  # b: 1.5 − 0.5
    assert s.get("time_to_first_token_seconds_bucket", le="2.5") == 2
    assert s.get("kv_cache_usage_perc") == 0 and s.get("num_requests_running") == 0


def test_preemption_counts_the_prompt_once_and_every_generated_token_once():
    # 4 blocks of 4 slots; each request grows to 3 blocks, so they preempt each other
    sched, clock = make_scheduler(num_blocks=4, block_size=4), Clock()
    m = EngineMetrics(clock=clock)
    reqs = [req("a", 4, 8), req("b", 5, 8)]
    for r in reqs:
        sched.add_request(r)
    run_all(sched, m, clock)
    s = Samples.of(m.registry)
    preemptions = sum(r.num_preemptions for r in reqs)
    assert preemptions > 0 and s.get("num_preemptions_total") == preemptions
    assert s.get("prompt_tokens_total") == 9 and s.get("generation_tokens_total") == 16
    assert s.get("request_queue_time_seconds_count") == 2 and s.get("time_to_first_token_seconds_count") == 2
    assert s.get("inter_token_latency_seconds_count") == 14 and s.get("e2e_request_latency_seconds_count") == 2


def test_prefix_cache_queries_and_hits_count_tokens_per_admission():
    sched, clock = make_scheduler(enable_prefix_caching=True, block_size=4), Clock()
    m = EngineMetrics(clock=clock)
    model = FakeModel(sched)  # one model for both: b reads the K/V a wrote
    for r in (req("a", 10, 2), req("b", 10, 2)):  # b comes after a has finished
        sched.add_request(r)
        while sched.has_unfinished():
            step(sched, model, m, clock)
    s = Samples.of(m.registry)
    assert s.get("prefix_cache_queries_total") == 20 and s.get("prefix_cache_hits_total") == 8


def test_abort_counts_and_the_steps_until_its_blocks_are_free():
    sched, clock = make_scheduler(), Clock()
    m = EngineMetrics(clock=clock)
    model = FakeModel(sched)
    sched.add_request(req("r", 6, 50))
    sched.add_request(req("q", 3, 50))
    step(sched, model, m, clock)
    # abort of r requested while the next step runs: that step completes, then the blocks go back
    out = sched.schedule()
    m.on_schedule(out)
    requested = clock.t + 0.1
    clock.t += 0.5
    m.on_update(sched.update(out, model.step(out)))
    m.on_abort(sched.abort_request("r"), requested)
    # abort of q requested between steps: applied before any further step
    m.on_abort(sched.abort_request("q"), clock.t + 0.01)
    m.on_abort(sched.abort_request("unknown"), 0.0)  # nothing to free: not counted
    m.update_gauges(sched)
    s = Samples.of(m.registry)
    assert s.get("request_success_total", finished_reason="abort") == 2
    assert s.get("abort_to_free_steps_bucket", le="0.0") == 1
    assert s.get("abort_to_free_steps_bucket", le="1.0") == 2 == s.get("abort_to_free_steps_count")
    assert s.get("kv_cache_usage_perc") == 0 and s.original()["block_num"] == 64
    # the aborted id is forgotten: a new request with the same id is a first scheduling again
    sched.add_request(req("r", 7, 2))
    step(sched, model, m, clock)
    assert Samples.of(m.registry).get("prompt_tokens_total") == 6 + 3 + 7


def test_an_abort_for_a_stop_string_counts_as_stop_with_its_latency():
    sched, clock = make_scheduler(), Clock(1.0)
    m = EngineMetrics(clock=clock)
    sched.add_request(req("s", 4, 50, arrival=0.0))
    step(sched, FakeModel(sched), m, clock)  # clock 1.5: first token
    m.on_abort(sched.abort_request("s"), clock.t, reason="stop")
    s = Samples.of(m.registry)
    assert s.get("request_success_total", finished_reason="stop") == 1
    assert s.get("request_success_total", finished_reason="abort") == 0
    assert s.get("e2e_request_latency_seconds_count") == 1
    assert s.get("e2e_request_latency_seconds_sum") == pytest.approx(1.5)


def test_gauges_and_the_original_family():
    sched, clock = make_scheduler(max_num_seqs=1, num_blocks=64, block_size=4), Clock()
    m = EngineMetrics(clock=clock)
    m.update_gauges(sched)
    assert Samples.of(m.registry).original() == {
        "batch_size": 0,
        "block_num": 64,
        "max_batch_size": 1,
        "max_block_num": 64,
        "available_resource": 1.0,
    }
    sched.add_request(req("a", 10, 5))
    sched.add_request(req("b", 3, 5))  # waits: BATCH_SIZE is 1
    step(sched, FakeModel(sched), m, clock)  # a holds ceil(11 / 4) = 3 blocks
    s = Samples.of(m.registry)
    assert s.get("num_requests_running") == 1 and s.get("num_requests_waiting") == 1
    assert s.get("kv_cache_usage_perc") == pytest.approx(3 / 64)
    assert s.original() == {
        "batch_size": 1,
        "block_num": 61,
        "max_batch_size": 1,
        "max_block_num": 64,
        "available_resource": pytest.approx(61 / 64),
    }
    # exactly as the original Triton backend exposed them: one label, named after the series
    assert 'inference_server_metrics{block_num="block_num"} 61.0' in s.text.splitlines()
    assert s.families["inference_server_metrics"].type == "gauge"


def test_a_scrape_on_another_thread_never_mixes_two_engine_turns():
    """The in-process front end renders /metrics on its IO thread while the engine updates: a
    scrape must not read `num_requests_running` of one turn and `kv_cache_usage_perc` of the next
    (CI once saw running 1 with KV usage 0 right after an abort)."""
    busy = make_scheduler(max_num_seqs=1, num_blocks=64, block_size=4)
    idle = make_scheduler(max_num_seqs=1, num_blocks=64, block_size=4)
    busy.add_request(req("a", 10, 5))
    step(busy, FakeModel(busy), EngineMetrics(clock=Clock()), Clock())  # 1 running, 3 blocks used
    m, stop = EngineMetrics(), threading.Event()

    def engine_turns() -> None:  # the engine thread flipping between the two states
        while not stop.is_set():
            m.update_gauges(busy)
            m.update_gauges(idle)

    # The engine publishes its first turn before any scrape (as Engine.__init__ does): otherwise a scrape
    # that runs before the thread's first update reads the registry's zeros (CI saw (0, 0, 0)).
    m.update_gauges(idle)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads as often as possible: a torn read shows up at once
    thread = threading.Thread(target=engine_turns)
    thread.start()
    try:
        torn = []
        for _ in range(30):
            s = Samples.of(m.registry)
            seen = (s.get("num_requests_running"), s.get("kv_cache_usage_perc"), s.original()["block_num"])
            if seen not in ((0, 0, 64), (1, 3 / 64, 61)):  # the idle turn or the busy one, whole
                torn.append(seen)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old_interval)
    assert not torn, f"{len(torn)} of 30 scrapes mixed two turns, e.g. {torn[:3]}"


def test_warm_up_is_not_counted_and_registries_are_private():
    sched, clock = make_scheduler(), Clock()
    m, other = EngineMetrics(clock=clock), EngineMetrics()  # a second one must not clash
    sched.add_request(req("__warmup__", 5, 4))
    with m.paused():
        run_all(sched, m, clock)
    s = Samples.of(m.registry)
    assert s.get("prompt_tokens_total") == s.get("generation_tokens_total") == s.get("engine_steps_total") == 0
    assert s.get("time_to_first_token_seconds_count") == 0
    assert Samples.of(other.registry).get("prompt_tokens_total") == 0
    assert SchedulerGauges.NAME in s.families and "process_resident_memory_bytes" in s.text
