"""The native HTTP API and health endpoints over real sockets: IOServer + FakeEngine + requests,
used the way the original tool's docs use them."""

import json
import socket
import time

import pytest
import requests

from tests.support.fakes import FakeTokenizer, Harness, assert_healthy, check_stream, echo, stream_lines, wait_idle

TOK = FakeTokenizer()


def test_docs_stream_text(srv):
    data = {"text": "Hello, how are you?", "req_id": "r-text", "max_dec_len": 40, "stream": True}
    frames = stream_lines(srv.url, data)
    assert len(frames) == 40 and all(len(f["token"]) == 1 for f in frames)  # real deltas
    last = check_stream(frames, "r-text")
    assert last["tokens_all"] == echo(TOK.encode_prompt(text=data["text"]), 40)
    assert last["finish_reason"] == "length" and "usage" not in last


def test_docs_three_turn_messages(srv):
    msgs = [
        {"role": "user", "content": "Hello, who are you"},
        {"role": "system", "content": "I'm a helpful AI assistant."},
        {"role": "user", "content": "List 3 countries and their capitals."},
    ]
    frames = stream_lines(srv.url, {"messages": msgs, "req_id": "r-msg", "stream": True})
    last = check_stream(frames, "r-msg")
    prompt = TOK.encode_prompt(messages=msgs)
    assert srv.engine.added[-1].prompt_token_ids == prompt
    # default max_dec_len = min(model_max_len - input_len, MAX_DEC_LEN) = min(300 - 119, 64)
    assert last["tokens_all"] == echo(prompt, 64)


def test_non_streaming_with_usage_and_system(srv):
    r = requests.post(
        srv.url, json={"text": "Hi", "system": "Be brief.", "max_dec_len": 10, "return_usage": True}, timeout=10
    )
    body = r.json()
    prompt = TOK.encode_prompt(text="Hi", system="Be brief.")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    assert body["result"] == body["tokens_all"] == echo(prompt, 10)
    assert body["tokens_all_num"] == 10 and body["finish_reason"] == "length"
    assert body["error_code"] == 0 and body["error_msg"] == "" and body["req_id"]
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 10, "total_tokens": len(prompt) + 10}


def test_input_ids_eos_and_min_dec_len(srv):
    ids = TOK.encode("abc")
    body = requests.post(srv.url, json={"input_ids": ids, "max_dec_len": 7}, timeout=10).json()
    assert body["tokens_all_ids"] == (ids * 3)[:7] and body["tokens_all"] == "abcabca"
    body = requests.post(
        srv.url, json={"input_ids": ids, "eos_token_ids": [ids[1]], "max_dec_len": 7}, timeout=10
    ).json()
    assert body["tokens_all"] == "ab" and body["finish_reason"] == "stop"
    body = requests.post(
        srv.url, json={"input_ids": ids, "eos_token_ids": [ids[1]], "min_dec_len": 3, "max_tokens": 7}, timeout=10
    ).json()
    assert body["tokens_all"] == "abcab"
    cmd = srv.engine.added[-1]
    assert cmd.params.eos_token_ids == (ids[1],) and cmd.params.max_tokens == 7


def test_stream_usage_and_sampling_fields_reach_engine(srv):
    frames = stream_lines(
        srv.url,
        {
            "text": "x",
            "stream": True,
            "seq_len": 5,
            "top_p": 0.5,
            "temperature": 0,
            "infer_seed": 7,
            "penalty_score": 1.2,
            "frequency_score": 0.1,
            "presence_score": 0.2,
            "return_usage": True,
        },
    )
    assert frames[-1]["usage"]["completion_tokens"] == 5
    p = srv.engine.added[-1].params
    assert (p.max_tokens, p.top_p, p.temperature, p.seed) == (5, 0.5, 0.0, 7)
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty) == (1.2, 0.1, 0.2)


def test_stop_sequences_streaming_and_not(srv):
    data = {
        "text": "hello world, hello",
        "req_id": "r-stop",
        "stop_sequences": ["world"],
        "stream": True,
        "max_dec_len": 60,
    }
    frames = stream_lines(srv.url, data)
    last = check_stream(frames, "r-stop")
    assert last["tokens_all"] == "<user>hello " and last["finish_reason"] == "stop"
    assert "w" not in "".join(f["token"] for f in frames)  # nothing past the cut was sent
    assert srv.engine.wait_aborted("r-stop")
    body = requests.post(srv.url, json={**data, "stream": False, "req_id": "r-stop2"}).json()
    assert body["result"] == "<user>hello " and body["finish_reason"] == "stop"


def test_disable_streaming_sends_only_final_frame(make_server):
    h = make_server(disable_streaming=True)
    frames = stream_lines(h.url, {"text": "abc", "stream": True, "max_dec_len": 8, "req_id": "r-ds"})
    last = check_stream(frames, "r-ds")
    assert len(frames) == 1 and last["token"] == last["tokens_all"] and len(last["token"]) == 8


BAD_FIELDS = [  # (field named in the error, its value); bool is no int, strings are no numbers
    ("req_id", ["x"]),
    ("text", 5),
    ("messages", "hi"),
    ("input_ids", [1, "2"]),
    ("system", 1),
    ("max_dec_len", True),
    ("max_dec_len", "10"),
    ("seq_len", 1.5),
    ("min_dec_len", "1"),
    ("topp", "0.5"),
    ("top_p", True),
    ("topp", 1.5),
    ("temperature", "hot"),
    ("temperature", -1),
    ("penalty_score", 0),
    ("frequency_score", "1"),
    ("presence_score", [0]),
    ("seed", "1"),
    ("infer_seed", 1.0),
    ("eos_token_ids", 2),
    ("stop_sequences", [1]),
    ("stream", "yes"),
    ("timeout", "30"),
    ("return_usage", 1),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS)
def test_400_names_the_field(srv, field, value):
    body = {field: value} if field in ("messages", "input_ids") else {"text": "hi", field: value}
    r = requests.post(srv.url, json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error_code"] == 400
    assert field in r.json()["error_msg"]
    assert_healthy(srv)


@pytest.mark.parametrize(
    "raw,needle",
    [
        (b"{not json", "JSON"),
        (b"[1, 2]", "object"),
        (b"\xff\xfe", "JSON"),
        (b"", "JSON"),
        (b'{"text": "a", "temperature": NaN}', "JSON"),
        (b'{"req_id": "q"}', "exactly one"),
        (b'{"text": "a", "input_ids": [5]}', "exactly one"),
    ],
)
def test_400_malformed_bodies(srv, raw, needle):
    r = requests.post(srv.url, data=raw, timeout=10)
    assert r.status_code == 400 and needle in r.json()["error_msg"]
    assert_healthy(srv)


def test_400_length_limits(srv):
    r = requests.post(srv.url, json={"req_id": "long", "input_ids": [5] * 257}, timeout=10)
    assert r.status_code == 400 and r.json() == {
        "req_id": "long",
        "error_code": 400,
        "error_msg": "Length of input token(257) exceeds the limit MAX_SEQ_LEN(256).",
    }
    r = requests.post(srv.url, json={"text": "a", "max_dec_len": 65}, timeout=10)
    assert (
        r.json()["error_msg"] == "The parameter max_dec_len(65) exceeds the limit MAX_DEC_LEN(64)."
        and r.status_code == 400
    )
    assert_healthy(srv)


def test_400_input_fills_model_length(make_server):
    h = make_server(max_seq_len=300, model_max_len=300)
    r = requests.post(h.url, json={"input_ids": [5] * 300}, timeout=10)
    assert r.status_code == 400 and "max length" in r.json()["error_msg"]
    body = requests.post(h.url, json={"input_ids": [5] * 296}, timeout=10).json()
    assert body["tokens_all_num"] == 4 and body["finish_reason"] == "length"  # clamped


def test_401_api_key_but_health_open(make_server):
    h = make_server(api_key="s3cret")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = requests.post(h.url, json={"text": "a"}, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error_code"] == 401
    r = requests.post(
        h.url, json={"text": "a", "max_dec_len": 2}, headers={"Authorization": "Bearer s3cret"}, timeout=10
    )
    assert r.status_code == 200 == requests.get(h.health + "/v2/health/ready").status_code


def test_409_duplicate_in_flight(make_server):
    h = make_server(step_s=0.02)
    res = requests.post(h.url, json={"text": "a", "req_id": "dup", "stream": True}, stream=True)
    next(lines := res.iter_lines())  # noqa: F841  (keep `lines`: a dropped line iterator disconnects)
    r = requests.post(h.url, json={"text": "b", "req_id": "dup"}, timeout=10)
    assert r.status_code == 409 and r.json()["req_id"] == "dup"
    res.close()
    assert h.engine.wait_aborted("dup")
    h.engine.step_s = 0.002
    assert_healthy(h)


def test_413_body_too_large(make_server):
    h = make_server(max_body_size=4096)
    for data in (json.dumps({"text": "x" * 5000}), iter([b'{"text": "', b"x" * 5000, b'"}'])):
        r = requests.post(h.url, data=data, timeout=10)  # with Content-Length, then chunked
        assert r.status_code == 413 and r.json()["error_code"] == 413
    assert_healthy(h)


def test_429_queue_full(make_server):
    h = make_server(capacity=2, step_s=0.02)
    held = [requests.post(h.url, json={"text": "a", "stream": True}, stream=True) for _ in range(2)]
    lines = [res.iter_lines() for res in held]  # kept alive: dropping one disconnects
    for it in lines:
        next(it)
    r = requests.post(h.url, json={"text": "c"}, timeout=10)
    assert r.status_code == 429 and r.json()["error_code"] == 429
    for res in held:
        res.close()
    assert wait_idle(h)
    h.engine.step_s = 0.002
    assert_healthy(h)


def test_503_not_ready_and_draining(srv):
    srv.client.ready.clear()
    r = requests.post(srv.url, json={"text": "a"}, timeout=10)
    assert r.status_code == 503 and r.json()["error_code"] == 503
    srv.client.ready.set(), srv.client.draining.set()
    assert requests.post(srv.url, json={"text": "a"}, timeout=10).status_code == 503
    srv.client.draining.clear()
    assert_healthy(srv)


def test_504_deadline(make_server):
    h = make_server(step_s=0.02)
    r = requests.post(h.url, json={"text": "a", "req_id": "late", "timeout": 0.2}, timeout=10)
    assert r.status_code == 504 and r.json()["error_code"] == 504
    assert h.engine.wait_aborted("late")
    frames = stream_lines(h.url, {"text": "a", "req_id": "late2", "timeout": 0.2, "stream": True})
    assert frames[-1]["is_end"] == 1 and frames[-1]["error_code"] == 504
    assert all(f["error_code"] == 0 for f in frames[:-1]) and len(frames) > 1
    assert h.engine.wait_aborted("late2")


def test_engine_error_before_and_after_first_frame(srv):
    srv.engine.fail_after.update({"e0": 0, "e3": 3})
    r = requests.post(srv.url, json={"text": "a", "req_id": "e0", "stream": True}, timeout=10)
    assert r.status_code == 500 and r.json()["error_msg"] == "fake engine failure"
    frames = stream_lines(srv.url, {"text": "a", "req_id": "e3", "stream": True})
    assert len(frames) == 4 and frames[-1]["is_end"] == 1 and frames[-1]["error_code"] == 500
    assert_healthy(srv)


def test_client_disconnect_aborts(make_server):
    h = make_server(step_s=0.01)
    res = requests.post(h.url, json={"text": "a", "req_id": "gone", "stream": True}, stream=True)
    lines = res.iter_lines()
    next(lines), next(lines)
    res.close()
    assert h.engine.wait_aborted("gone", timeout=1.0)
    h.engine.step_s = 0.002
    assert_healthy(h)


def test_body_with_model_goes_to_openai_and_unknown_path(srv):
    r = requests.post(srv.url, json={"model": "default", "messages": []}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = requests.get(srv.base + "/nope", timeout=10)
    assert r.status_code == 404 and r.json()["error_code"] == 404


def test_health_transitions(srv):
    urls = [srv.health + "/v2/health/live", srv.base + "/v2/health/live", srv.base + "/health"]
    ready = [srv.health + "/v2/health/ready", srv.base + "/v2/health/ready"]
    codes = lambda us: {requests.get(u, timeout=10).status_code for u in us}  # noqa: E731
    assert codes(urls) == {200} and codes(ready) == {200}
    srv.engine.paused.set()
    time.sleep(0.05)
    srv.client.heartbeat = time.monotonic() - 60  # the loop stopped beating
    assert codes(urls) == {503}
    assert requests.get(urls[0], timeout=10).json()["error_code"] == 503
    srv.client.busy_since = time.monotonic() - 60  # ... inside a long step: alive
    assert codes(urls) == {200}
    srv.client.busy_since = None
    srv.engine.paused.clear()
    time.sleep(0.1)
    assert codes(urls) == {200}
    srv.client.ready.clear()
    assert codes(ready) == {503}
    srv.client.ready.set(), srv.client.draining.set()
    assert codes(ready) == {503}


def test_start_fails_on_busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=str(port)):
            Harness(http_port=port)


def test_client_gone_while_waiting_for_first_output(srv):
    srv.engine.paused.set()  # nothing comes back: the handler just waits
    time.sleep(0.05)  # let the fake finish the step it may be in
    # ReadTimeout, or (if a token slipped out before the pause) a timeout reading the body
    with pytest.raises((requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError)):
        requests.post(srv.url, json={"text": "a", "req_id": "w", "stream": True}, timeout=0.3)
    assert wait_idle(srv, timeout=1.0)  # aborted on the IO side at once
    srv.engine.paused.clear()
    assert srv.engine.wait_aborted("w")


def test_disabled_port_and_clean_stop(make_server):
    h = make_server(health_port=-1)
    assert h.server.health_port is None
    assert requests.get(h.base + "/v2/health/ready", timeout=10).status_code == 200
    h.server.stop(timeout=5)
    assert not h.server._thread.is_alive()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(h.base + "/health", timeout=2)
    h.server.stop(timeout=1)  # a second stop is harmless


def test_return_all_tokens_streams_only_the_final_frame_and_benchmark_timings(srv):
    frames = stream_lines(
        srv.url,
        {
            "text": "abc",
            "req_id": "all",
            "max_dec_len": 6,
            "stream": True,
            "return_all_tokens": True,
            "benchmark": True,
        },
    )
    assert len(frames) == 1 and frames[0]["is_end"] == 1
    last = check_stream(frames, "all")
    assert last["tokens_all_num"] == 6 and last["token"] == last["tokens_all"]
    b = last["benchmark"]
    assert 0 <= b["time_to_first_token_s"] <= b["total_time_s"] and b["decode_tokens_per_s"] > 0
    r = requests.post(srv.url, json={"text": "abc", "max_dec_len": 3}, timeout=10).json()
    assert "benchmark" not in r


def test_input_ids_outside_the_vocabulary_are_400(srv):
    r = requests.post(srv.url, json={"input_ids": [5, TOK.vocab_size], "max_dec_len": 2}, timeout=10)
    assert r.status_code == 400 and "vocabulary" in r.json()["error_msg"]
    assert_healthy(srv)
