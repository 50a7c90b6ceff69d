"""Engine metrics over the real Engine loop and the `/metrics` service (CONTRACT.md §6): the loop
with a fake runner records requests where the definitions say and goes back to idle, an abort
frees its blocks within a step, and the Prometheus endpoint serves text without the API key on a
real socket.  Every scrape goes through prometheus_client's own text parser."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from spmd_serve.engine.client import EngineClient
from spmd_serve.engine.engine import Engine
from spmd_serve.engine.metrics import EngineMetrics, SchedulerGauges
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.scheduler import SchedulerConfig
from tests.support.fakes import FakeComm, FakeRunner
from tests.support.metrics_scrape import P, Samples


# ---- the real Engine loop, fake ranks ------------------------------------------------------------
@pytest.fixture
def engine():
    client = EngineClient(capacity=8)
    client.ready.set()
    cfg = SchedulerConfig(
        max_num_seqs=4,
        num_blocks=32,
        block_size=4,
        block_ratio=1.0,
        max_waiting=8,
        max_num_batched_tokens=64,
        max_model_len=512,
    )
    eng = Engine(cfg, FakeComm(), FakeRunner(), client, frozenset())
    thread = threading.Thread(target=eng.run, name="test-engine", daemon=True)
    thread.start()
    yield eng
    eng.stop_event.set()
    client.wake()
    thread.join(5)
    assert not thread.is_alive()


def wait_scrape(m: EngineMetrics, ok, timeout: float = 10.0) -> Samples:
    end = time.monotonic() + timeout
    while True:
        s = Samples.of(m.registry)
        if ok(s) or time.monotonic() > end:
            return s
        time.sleep(0.005)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0)


def test_engine_loop_records_requests_and_goes_back_to_idle(engine):
    m, client = engine.metrics, engine.client
    client.add_request("a", [3, 4, 5], greedy(4))
    client.add_request("b", [9] * 5, greedy(6))
    s = wait_scrape(m, lambda s: s.get("request_success_total", finished_reason="length") == 2)
    s = wait_scrape(m, lambda s: s.get("num_requests_running") == 0)
    assert s.get("request_success_total", finished_reason="length") == 2
    assert s.get("prompt_tokens_total") == 8 and s.get("generation_tokens_total") == 10
    assert s.get("time_to_first_token_seconds_count") == 2 == s.get("e2e_request_latency_seconds_count")
    assert s.get("inter_token_latency_seconds_count") == 8 and s.get("request_queue_time_seconds_count") == 2
    assert s.get("engine_steps_total") >= 6
    assert s.get("kv_cache_usage_perc") == 0 and s.original()["block_num"] == 32


def test_engine_frees_an_aborted_request_within_one_step(engine):
    m, client = engine.metrics, engine.client
    client.add_request("long", [3, 4, 5], greedy(100))  # 26 of the 32 blocks at most
    s = wait_scrape(m, lambda s: s.get("generation_tokens_total") >= 3)
    assert s.get("num_requests_running") == 1 and s.get("kv_cache_usage_perc") > 0
    client.abort("long")
    s = wait_scrape(m, lambda s: s.get("kv_cache_usage_perc") == 0)
    assert s.get("kv_cache_usage_perc") == 0 and s.get("num_requests_running") == 0
    assert s.get("request_success_total", finished_reason="abort") == 1
    assert s.get("abort_to_free_steps_count") == 1 == s.get("abort_to_free_steps_bucket", le="1.0")
    assert s.get("generation_tokens_total") < 100


# ---- the /metrics service ---------------------------------------------------------------------------
def start_io(registry, port: int = 0):
    from spmd_serve.frontend.server.app import IOServer
    from spmd_serve.frontend.server.metrics_service import MetricsService
    from tests.support.fakes import FakeTokenizer

    service = MetricsService(registry, "127.0.0.1", port)
    io = IOServer(
        EngineClient(1),
        FakeTokenizer(),
        host="127.0.0.1",
        http_port=-1,
        health_port=-1,
        api_key="secret",
        services=[service],
    )
    io.start(timeout=5)
    return io, f"http://127.0.0.1:{service.port}"


CONTRACT = {
    "num_requests_running": "gauge",
    "num_requests_waiting": "gauge",
    "kv_cache_usage_perc": "gauge",
    "prompt_tokens": "counter",
    "generation_tokens": "counter",
    "request_success": "counter",
    "num_preemptions": "counter",
    "time_to_first_token_seconds": "histogram",
    "inter_token_latency_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram",
    "request_queue_time_seconds": "histogram",
}


def test_metrics_endpoint_serves_prometheus_text_without_the_api_key():
    m = EngineMetrics()
    io, base = start_io(m.registry)
    try:
        res = requests.get(base + "/metrics", timeout=10)  # no Authorization header
        assert res.status_code == 200 and res.headers["Content-Type"].startswith("text/plain")
        s = Samples(res.text)
        assert {name: s.families[P + name].type for name in CONTRACT} == CONTRACT
        assert set(s.original()) == set(SchedulerGauges.SERIES)
        om = requests.get(base + "/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=10)
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert om.text.endswith("# EOF\n")
        assert requests.get(base + "/", timeout=10).status_code == 404
        assert requests.get(base + "/metrics/x", timeout=10).status_code == 404
    finally:
        io.stop()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(base + "/metrics", timeout=2)


def test_busy_metrics_port_is_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port} \\(METRICS_HTTP_PORT\\)"):
            start_io(EngineMetrics().registry, port)
