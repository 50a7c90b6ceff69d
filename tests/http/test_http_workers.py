"""The front end in worker processes, wired in one test process (tests/support/remote_harness.py):
two HTTP workers talk to rank 0's FrontendHub over real loopback sockets, and a fake engine drives
the hub as the engine loop does.  What a user sees must not depend on which worker a connection
lands on: requests are served by either, a req_id in flight anywhere is a 409 and the capacity
counts every worker's requests (429); a cancel reaches the engine; health, readiness and /metrics
come from the engine; a worker that goes away has its requests aborted, and when rank 0 goes away
every request in flight ends with a 503 error frame (an operator's question waiting for its answer
too); an operator's abort sent to one worker ends a request on the other."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from spmd_serve.engine.outputs import RequestOutput
from tests.support.fakes import check_stream, echo, stream_lines
from tests.support.remote_harness import RawWorker, RemoteHarness, wait_for


@pytest.fixture
def harness():
    made: list[RemoteHarness] = []
    yield lambda **kw: made.append(RemoteHarness(**kw)) or made[-1]
    for h in made:
        h.close()


def scrape_through_hub(h: RemoteHarness, w) -> requests.Response:
    """GET a worker's /metrics while this thread polls the hub (its engine thread stopped)."""
    got: list[requests.Response] = []
    scrape = threading.Thread(target=lambda: got.append(requests.get(w.metrics_url, timeout=10)))
    scrape.start()
    while scrape.is_alive():
        h.hub.wait_for_work(0.02)
    return got[0]


def long_stream(url: str, req_id: str, n: int = 1 << 20) -> requests.Response:
    """A stream that runs until the test closes it (or the server ends it)."""
    body = {"text": "abc", "req_id": req_id, "max_dec_len": n, "min_dec_len": n, "stream": True}
    res = requests.post(url, json=body, stream=True, timeout=10)
    assert res.status_code == 200, res.text
    return res


def test_native_and_openai_requests_are_served_by_either_worker(harness):
    h = harness()
    for w in h.workers:
        last = check_stream(stream_lines(w.url, {"text": "hey", "req_id": "s", "max_dec_len": 5, "stream": True}), "s")
        assert last["tokens_all"] == echo(last["tokens_all_ids"], 5) and last["tokens_all_num"] == 5
        body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        res = requests.post(w.base + "/v1/chat/completions", json=body, timeout=10)
        assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] == 4, res.text
        assert requests.get(w.health + "/v2/health/ready", timeout=5).status_code == 200
    assert h.hub.num_in_flight == 0


def test_a_req_id_in_flight_on_one_worker_is_409_on_the_other(harness):
    h = harness(step_s=0.02)
    w0, w1 = h.workers
    stream = long_stream(w0.url, "dup")
    res = requests.post(w1.url, json={"text": "x", "req_id": "dup", "max_dec_len": 2}, timeout=10)
    assert res.status_code == 409 and res.json()["error_msg"] == "req_id 'dup' is already in flight"
    assert json.loads(next(stream.iter_lines()))["req_id"] == "dup"  # still streaming
    stream.close()
    wait_for(lambda: h.hub.num_in_flight == 0, what="the stream's end at the hub")
    again = requests.post(w1.url, json={"text": "x", "req_id": "dup", "max_dec_len": 2}, timeout=10)
    assert again.status_code == 200 and again.json()["tokens_all_num"] == 2


def test_the_capacity_counts_the_requests_of_every_worker(harness):
    h = harness(capacity=2, step_s=0.02)
    w0, w1 = h.workers
    streams = [long_stream(w0.url, "a"), long_stream(w0.url, "b")]
    res = requests.post(w1.url, json={"text": "x", "max_dec_len": 2}, timeout=10)
    assert res.status_code == 429 and "BATCH_SIZE + MAX_CACHED_TASK_NUM = 2" in res.json()["error_msg"]
    for s in streams:
        s.close()
    wait_for(lambda: h.hub.num_in_flight == 0, what="the cancelled streams' aborts")
    assert requests.post(w1.url, json={"text": "x", "max_dec_len": 2}, timeout=10).status_code == 200


def test_a_client_that_goes_away_aborts_its_request_in_the_engine(harness):
    h = harness(step_s=0.02)
    stream = long_stream(h.workers[1].url, "gone")
    next(stream.iter_lines())  # the first frame arrived: the request runs in the engine
    stream.close()
    assert h.engine.wait_aborted("gone", timeout=5)
    wait_for(lambda: h.hub.num_in_flight == 0 and h.workers[1].client.num_in_flight == 0, what="forgotten")


def test_readiness_draining_and_liveness_come_from_the_engine(harness):
    h = harness(ready=False)
    w = h.workers[0]
    ready = requests.get(w.health + "/v2/health/ready", timeout=5)
    assert ready.status_code == 503 and ready.json()["error_msg"] == "model is not loaded yet"
    assert requests.post(w.url, json={"text": "x"}, timeout=5).status_code == 503
    h.set_ready()
    assert requests.get(w.health + "/v2/health/ready", timeout=5).status_code == 200
    h.hub.draining.set()
    h.hub.wake()
    wait_for(lambda: w.client.draining.is_set(), what="draining on the worker")
    ready = requests.get(w.base + "/v2/health/ready", timeout=5)  # the service port answers too
    assert ready.status_code == 503 and ready.json()["error_msg"] == "server is shutting down"
    res = requests.post(w.url, json={"text": "x"}, timeout=5)
    assert res.status_code == 503 and res.json()["error_msg"] == "server is shutting down"
    # the engine's heartbeats keep it live; beats that stop make it not live after the threshold
    assert requests.get(w.health + "/v2/health/live", timeout=5).status_code == 200
    h.engine.stop()  # no more beats; this thread drives the hub from now on
    assert scrape_through_hub(h, w).status_code == 200  # a round trip: the last beat has been read
    w.client.heartbeat -= 60  # as if that beat were a minute old
    w.client.busy_since = None
    live = requests.get(w.health + "/v2/health/live", timeout=5)
    assert live.status_code == 503 and "engine loop has not reported" in live.json()["error_msg"]
    h.hub.heartbeat = time.monotonic() + 1  # the engine loop turns again: a beat goes out
    wait_for(lambda: requests.get(w.health + "/v2/health/live", timeout=5).status_code == 200, what="live again")


def test_metrics_are_the_engines_registry_with_every_workers_handoffs(harness):
    h = harness()
    for w in h.workers:
        assert requests.post(w.url, json={"text": "hello", "max_dec_len": 5}, timeout=10).status_code == 200
    for i, w in enumerate(h.workers):
        res = requests.get(w.metrics_url, timeout=5)
        assert res.status_code == 200 and res.headers["Content-Type"].startswith("text/plain")
        assert f"fake_scrapes_total {float(i + 1)}" in res.text  # rendered by the hub, once per scrape
    # each worker reports its delivery times (before answering a scrape, or within 0.2 s)
    wait_for(lambda: sum(n for _, n in h.handoffs) >= 10, what="hand-off reports")
    assert all(0 <= s < 5 * n for s, n in h.handoffs)


def test_when_rank0_goes_away_every_request_ends_with_503(harness):
    h = harness(step_s=0.02)
    w = h.workers[0]
    lines = long_stream(w.url, "orphan").iter_lines()
    next(lines)
    h.engine.pause()  # a question the engine takes no more: rank 0 goes away before it answers
    flushed: list[requests.Response] = []
    asking = threading.Thread(target=lambda: flushed.append(requests.post(w.base + "/flush_cache", timeout=20)))
    asking.start()
    wait_for(lambda: w.client._answers, what="the question sent")
    h.crash_engine()
    asking.join(10)
    assert flushed[0].status_code == 503 and "rank 0" in flushed[0].json()["error"]["message"]
    last = json.loads(list(lines)[-1])
    assert last["is_end"] == 1 and last["error_code"] == 503 and "rank 0" in last["error_msg"], last
    assert "exited unexpectedly" in last["error_msg"]
    ready = requests.get(w.health + "/v2/health/ready", timeout=5)
    assert ready.status_code == 503 and "rank 0" in ready.json()["error_msg"]
    assert w.link.done.wait(5) and not w.link.stopped_cleanly


def test_bye_comes_after_the_engines_last_outputs_and_ends_the_worker(harness):
    h = harness(step_s=0.02)
    w = h.workers[1]
    lines = long_stream(w.url, "last").iter_lines()
    next(lines)
    h.engine.stop()  # the engine loop ended; its shutdown fails what is left, then the hub says bye
    h.hub.publish([RequestOutput.error("last", 503, "server is shutting down")])
    h.hub.close()
    last = json.loads(list(lines)[-1])
    assert last["is_end"] == 1 and last["error_code"] == 503 and last["error_msg"] == "server is shutting down"
    assert w.link.done.wait(5) and w.link.stopped_cleanly


def test_a_worker_that_disconnects_has_its_requests_aborted(harness):
    h = harness(workers=1, step_s=0.02)
    raw = RawWorker(h.hub)
    raw.send({"t": "hello", "worker": 7, "pid": 1, "token": h.hub.token, "ok": True})
    assert raw.recv_until("state")["ready"] is True
    raw.send({"t": "add", "n": 1, "id": "raw", "prompt": [1, 4, 5], "params": {"max_tokens": 1 << 20}, "at": 0.0})
    assert raw.recv_until("out")["o"][0][0] == 1  # the worker's own number for the request
    raw.close()
    assert h.engine.wait_aborted("raw", timeout=5)
    wait_for(lambda: 7 not in h.hub.workers and h.hub.num_in_flight == 0, what="the link dropped")


def test_a_connection_without_the_token_is_closed_and_adds_nothing(harness):
    h = harness(workers=1)
    raw = RawWorker(h.hub)
    raw.send({"t": "hello", "worker": 3, "pid": 1, "token": "guess", "ok": True})
    raw.send({"t": "add", "n": 1, "id": "evil", "prompt": [1], "params": {}, "at": 0.0})
    assert raw.closed_by_hub()
    assert 3 not in h.hub.workers and not any(cmd.req_id == "evil" for cmd in h.engine.added)


def test_a_request_the_engine_never_took_still_ends_when_the_hub_closes(harness):
    h = harness(workers=1)
    raw = RawWorker(h.hub)
    raw.send({"t": "hello", "worker": 5, "pid": 1, "token": h.hub.token, "ok": True})
    raw.recv_until("state")
    h.engine.stop()  # the engine loop has ended: nothing takes commands any more
    raw.send({"t": "add", "n": 1, "id": "late", "prompt": [1, 4], "params": {"max_tokens": 5}, "at": 0.0})
    wait_for(lambda: h.hub.wait_for_work(0.05) or h.hub.num_in_flight == 1, what="the add read by the hub")
    h.hub.close()
    out = raw.recv_until("out")["o"][0]
    assert out[0] == 1 and out[2] is True and (out[4], out[5]) == (503, "server is shutting down")
    raw.recv_until("bye")


def test_the_hellos_carry_the_tokenizer_facts_rank_0_needs(harness):
    """Rank 0 loads no tokenizer: the EOS ids and the warm-up prompt come in the first worker's
    hello (the harness's workers: the fake tokenizer's); a hello with malformed facts is refused."""
    from spmd_serve.http_worker import WARM_UP_TEXT
    from tests.support.fakes import FakeTokenizer

    h = harness(workers=1)
    tok = FakeTokenizer()
    assert h.hub.eos_token_ids == frozenset(tok.eos_token_ids) and tok.eos_token_ids
    assert h.hub.warm_up_ids == tok.encode(WARM_UP_TEXT) and h.hub.warm_up_ids
    fresh = harness(workers=0)
    raw = RawWorker(fresh.hub)
    raw.send({"t": "hello", "worker": 1, "pid": 1, "token": fresh.hub.token, "ok": True, "eos": ["2"], "warm_up": [1]})
    assert raw.closed_by_hub()
    assert 1 not in fresh.hub.workers and fresh.hub.warm_up_ids == []


def test_each_worker_sends_the_vocabulary_once_ahead_of_its_first_json_request(harness):
    """Rank 0 holds no tokenizer: a worker sends every token's bytes (special ones empty) before its
    first request with a JSON schema, once; the engine takes them as a command, before that request."""
    from spmd_serve.engine.json_masks import vocabulary_bytes
    from tests.support.fakes import FakeTokenizer

    h = harness()
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    plain = requests.post(h.workers[0].base + "/v1/chat/completions", json=body, timeout=10)
    assert plain.status_code == 200 and h.engine.vocabs == []
    as_json = {**body, "response_format": {"type": "json_object"}}
    for w, sent in ((0, 1), (0, 1), (1, 2)):
        res = requests.post(h.workers[w].base + "/v1/chat/completions", json=as_json, timeout=10)
        assert res.status_code == 200, res.text
        assert len(h.engine.vocabs) == sent
    want = vocabulary_bytes(FakeTokenizer())
    assert [v for _, v in h.engine.vocabs] == [want, want] and b"" in want and any(want)
    first = h.engine.vocabs[0][0]  # adds taken before the first vocabulary: the plain request's
    assert first == 1 and h.engine.added[first].params.json_schema


def test_a_worker_that_exited_after_saying_why_is_reported_by_its_reason():
    """A worker that fails (a bad tokenizer) sends its reason and exits, possibly long before rank 0,
    still loading, waits for the hellos: the reason is the error, not the bare exit code."""
    from spmd_serve.engine.frontend_hub import FrontendHub
    from spmd_serve.engine.remote_client import report_start_failure

    hub = FrontendHub(0, 4, lambda accept: (b"", "text/plain"))
    try:
        raw = RawWorker(hub)
        report_start_failure(raw.sock, 0, hub.token, "cannot load the tokenizer of /m: invalid chat_template")
        raw.close()
        time.sleep(0.2)  # the worker is gone before rank 0 looks
        with pytest.raises(RuntimeError, match="^cannot load the tokenizer of /m: invalid chat_template$"):
            hub.wait_workers(1, 5.0, lambda: "HTTP worker 0 exited with code 2 before it was ready")
    finally:
        hub.close()
    silent = FrontendHub(0, 4, lambda accept: (b"", "text/plain"))
    try:
        with pytest.raises(RuntimeError, match="^exited with code 2$"):  # no reason sent: the exit
            silent.wait_workers(1, 5.0, lambda: "exited with code 2")
    finally:
        silent.close()


def test_an_abort_sent_to_one_worker_ends_a_request_on_the_other(harness):
    """An operator's command goes over the link and its answer comes back to the worker that asked;
    the aborted request's end goes to the worker that owns it."""
    h = harness(step_s=0.02)
    w0, w1 = h.workers
    lines = (line for line in long_stream(w0.url, "theirs").iter_lines() if line)
    next(lines)  # running (one reader: a generator dropped would close the connection)
    res = requests.post(w1.base + "/abort_request", json={"rid": "theirs"}, timeout=10)
    assert res.status_code == 200 and res.json() == {"aborted": ["theirs"]}
    last = json.loads(list(lines)[-1])
    assert last["is_end"] == 1 and last["finish_reason"] == "abort"
    flushed = requests.post(w0.base + "/flush_cache", timeout=10)
    assert flushed.status_code == 200 and [c.op for c in h.engine.controls] == ["abort", "reset_prefix_cache"]
    wait_for(lambda: h.hub.num_in_flight == 0 and w0.client.num_in_flight == 0, what="forgotten")
