"""The native HTTP API and health endpoints over real sockets: IOServer + FakeEngine + requests,
used the way the original tool's docs use them."""

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
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 10,
        "total_tokens": len(prompt) + 10,
        "cached_tokens": 0,
    }


def test_usage_reports_the_cached_prompt_tokens_of_a_repeated_prefix(srv):
    """The fake engine caches like the real one (tests/support/fakes.py); the number reaches usage."""
    srv.engine.prefix_cache = True
    body = {"text": "a shared system prompt, then a question", "max_dec_len": 3, "return_usage": True}
    first = requests.post(srv.url, json=body, timeout=10).json()
    again = stream_lines(srv.url, dict(body, stream=True))[-1]
    prompt = TOK.encode_prompt(text=body["text"])
    assert first["usage"]["cached_tokens"] == 0
    assert again["usage"]["cached_tokens"] == (len(prompt) - 1) // 4 * 4 > 0


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
    srv.engine.pause()
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
    srv.engine.pause()  # nothing comes back: the handler just waits
    with pytest.raises(requests.exceptions.ReadTimeout):
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
