"""`/metrics` of a real `mpirun -n 2 spmd_serve` on the demo model (CONTRACT.md §6, issue 3):
prometheus_client's parser reads it; after native requests of exact lengths the token counters,
the success counter and the latency histograms have grown by exactly the right amounts; a
streaming client that hangs up mid-stream has its sequence aborted and its KV blocks back in the
free pool within one engine step.  API_KEY is set: the API needs it, /metrics stays open."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support import long_model
from tests.support.failing_jobs import error_lines, run_with_busy_port
from tests.support.metrics_scrape import Samples
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
KEY = "metrics-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(served_tp2_long, tmp_path_factory):
    # USE_WARMUP=1: the warm-up request runs through the engine but must not show in the metrics;
    # the long context: the hung-up stream below must not end on its own before the test hangs up
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with ServerProcess(2, served_tp2_long, log, USE_WARMUP="1", API_KEY=KEY, **long_model.SERVER_ENV) as srv:
        srv.metrics_url = f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics"
        srv.first_scrape = scrape(srv)
        yield srv


def scrape(srv: ServerProcess) -> Samples:
    res = requests.get(srv.metrics_url, timeout=10)  # no API key: metrics are open
    assert res.status_code == 200 and res.headers["Content-Type"].startswith("text/plain"), res.text
    return Samples(res.text)


def wait_scrape(srv: ServerProcess, ok, timeout: float = 15.0) -> Samples:
    """Poll until `ok(scrape)`; returns the last scrape either way (the caller asserts)."""
    end = time.monotonic() + timeout
    while True:
        s = scrape(srv)
        if ok(s) or time.monotonic() > end:
            return s
        time.sleep(0.02)


def idle(s: Samples) -> bool:
    o = s.original()
    return (
        s.get("num_requests_running") == s.get("num_requests_waiting") == s.get("kv_cache_usage_perc") == 0
        and o["batch_size"] == 0
        and o["block_num"] == o["max_block_num"]
        and o["available_resource"] == 1
    )


def test_fresh_server_after_warm_up_reports_idle_and_nothing_counted(server):
    s = server.first_scrape
    assert idle(s) and s.original()["max_batch_size"] == 50 and s.original()["max_block_num"] > 0
    for name in (
        "prompt_tokens_total",
        "generation_tokens_total",
        "engine_steps_total",
        "time_to_first_token_seconds_count",
        "e2e_request_latency_seconds_count",
    ):
        assert s.get(name) == 0, name
    assert requests.post(server.url, json={"input_ids": [1, 2], "max_dec_len": 1}, timeout=30).status_code == 401


def test_counters_and_histograms_grow_by_exact_amounts(server):
    prompts = [[1, 17, 300, 45], [1] + list(range(40, 52)), [1, 900, 901], [1] + [88] * 30]
    lengths = [5, 9, 3, 12]
    before = scrape(server)

    def run(prompt_and_len):
        prompt, n = prompt_and_len
        body = {"input_ids": prompt, "max_dec_len": n, "min_dec_len": n, "temperature": 0}
        res = requests.post(server.url, json=body, headers=AUTH, timeout=120)
        assert res.status_code == 200, res.text
        return res.json()

    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(run, zip(prompts, lengths)))
    assert [r["tokens_all_num"] for r in results] == lengths and {r["finish_reason"] for r in results} == {"length"}
    n, want_success = len(prompts), before.get("request_success_total", finished_reason="length") + len(prompts)
    # the engine records a step right after publishing it: allow it a moment to catch up
    after = wait_scrape(server, lambda s: s.get("request_success_total", finished_reason="length") >= want_success)
    assert after.delta(before, "prompt_tokens_total") == sum(map(len, prompts))
    assert after.delta(before, "generation_tokens_total") == sum(lengths)
    assert after.delta(before, "request_success_total", finished_reason="length") == n
    assert after.delta(before, "request_success_total", finished_reason="stop") == 0
    assert after.delta(before, "request_success_total", finished_reason="abort") == 0
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert after.delta(before, hist + "_count") == n, hist
        assert after.delta(before, hist + "_sum") > 0, hist
    assert after.delta(before, "inter_token_latency_seconds_count") == sum(lengths) - n
    assert after.delta(before, "engine_steps_total") >= max(lengths)
    assert idle(wait_scrape(server, idle))


def test_client_hanging_up_mid_stream_frees_its_blocks_within_one_step(server):
    prompt, max_dec_len = [1, 5, 6, 7, 8, 9], long_model.TOKENS  # minutes of steps if it were not aborted
    before = wait_scrape(server, idle)
    assert idle(before)
    body = json.dumps(
        {"input_ids": prompt, "max_dec_len": max_dec_len, "min_dec_len": max_dec_len, "temperature": 0, "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    try:
        sock.sendall(head + body)
        received = b""
        while received.count(b'"send_idx"') < 2:  # a couple of frames
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
        mid = scrape(server)
        assert mid.get("num_requests_running") == 1 and mid.get("kv_cache_usage_perc") > 0
        assert mid.original()["block_num"] < mid.original()["max_block_num"]
        sock.setblocking(False)  # take what has arrived, then hang up
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except BlockingIOError:
            pass
    finally:
        sock.close()
    frames_seen = received.count(b'"send_idx"')
    after = wait_scrape(server, idle, timeout=10)
    assert idle(after), "the hung-up request still holds KV blocks"
    assert after.delta(before, "request_success_total", finished_reason="abort") == 1
    assert after.delta(before, "request_success_total", finished_reason="length") == 0
    assert after.delta(before, "prompt_tokens_total") == len(prompt)
    # Inside the engine: the abort was applied at most one step after the IO thread asked for it.
    assert after.delta(before, "abort_to_free_steps_count") == 1
    assert after.delta(before, "abort_to_free_steps_bucket", le="1.0") == 1
    # From outside: tokens generated but never delivered = steps between the hang-up and the free
    # (plus frames still in flight on loopback); without the abort this would be ~TOKENS.
    generated = after.delta(before, "generation_tokens_total")
    assert frames_seen <= generated <= frames_seen + 16, (frames_seen, generated)
    assert requests.get(f"http://127.0.0.1:{server.health_port}/v2/health/ready", timeout=5).status_code == 200


def test_busy_metrics_port_stops_the_job_with_one_line_naming_it(served_tp2):
    res, port = run_with_busy_port(served_tp2, "METRICS_HTTP_PORT")
    lines = error_lines(res)
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-2000:]
    assert "METRICS_HTTP_PORT" in lines[0] and str(port) in lines[0] and "Traceback" not in res.stderr
