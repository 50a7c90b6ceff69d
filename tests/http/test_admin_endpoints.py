"""The operator's endpoints over real sockets with a fake engine (frontend/server/admin.py): vLLM's
/reset_prefix_cache and SGLang's /flush_cache make a repeated prompt find nothing cached; SGLang's
/abort_request ends a request by its rid (a /generate rid, a native req_id) or every request, each
API saying so in its own way (finish_reason "abort" where it has one, an error where it has none);
bad bodies, a missing key and an engine not ready are refused."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import requests

from tests.support.fakes import wait_idle

SLOW_S = 0.2  # a fake step: a 64-token answer outlives an abort sent after its first token by seconds
ABORTED = "aborted by /abort_request"


@pytest.fixture
def srv(make_server):
    return make_server()


@pytest.fixture
def slow(make_server):
    return make_server(step_s=SLOW_S)


def cached(srv, text: str) -> int:
    body = {"text": text, "max_dec_len": 2, "return_usage": True}
    return requests.post(srv.url, json=body, timeout=10).json()["usage"]["cached_tokens"]


def test_a_reset_or_a_flush_forgets_the_cached_prompts(srv):
    srv.engine.prefix_cache = True
    text = "a shared system prompt, then a question"
    assert cached(srv, text) == 0 and cached(srv, text) > 0
    r = requests.post(srv.base + "/reset_prefix_cache", timeout=10)
    assert (r.status_code, r.content) == (200, b"")
    assert cached(srv, text) == 0 and cached(srv, text) > 0
    for method in ("GET", "POST"):
        r = requests.request(method, srv.base + "/flush_cache", timeout=10)
        assert (r.status_code, r.text) == (200, "Cache flushed.\n") and r.headers["Content-Type"].startswith(
            "text/plain"
        )
        assert cached(srv, text) == 0 and cached(srv, text) > 0
    assert [c.op for c in srv.engine.controls] == ["reset_prefix_cache"] * 3


def test_refusals_method_query_key_and_readiness(make_server):
    h = make_server(api_key="secret")
    assert requests.get(h.base + "/reset_prefix_cache", timeout=10).status_code == 405
    for path, body in (("/reset_prefix_cache", None), ("/flush_cache", None), ("/abort_request", {"abort_all": True})):
        r = requests.post(h.base + path, json=body, timeout=10)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"], path
        r = requests.post(h.base + path, json=body, headers={"Authorization": "Bearer secret"}, timeout=10)
        assert r.status_code == 200, (path, r.text)
    r = requests.post(h.base + "/flush_cache?device=gpu", headers={"Authorization": "Bearer secret"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "device"
    assert not [c for c in h.engine.controls if c.op == "abort" and c.args["req_ids"]]
    down = make_server(ready=False)
    r = requests.post(down.base + "/reset_prefix_cache", timeout=10)
    assert r.status_code == 503 and "not ready" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body, words",
    [
        ({}, "give the rid"),
        ({"rid": ""}, "give the rid"),
        ({"rid": 7}, "rid must be a string"),
        ({"abort_all": "yes"}, "abort_all must be true or false"),
        ({"rid": "x", "abort_message": "bye"}, "unknown field 'abort_message'"),
    ],
)
def test_abort_bodies_are_checked(srv, body, words):
    r = requests.post(srv.base + "/abort_request", json=body, timeout=10)
    assert r.status_code == 400 and words in r.json()["error"]["message"]
    assert srv.engine.controls == []


def abort(srv, **body: Any) -> list[str]:
    r = requests.post(srv.base + "/abort_request", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["aborted"]


def stream_then_abort(srv, path: str, body: dict[str, Any], **abort_body: Any) -> tuple[list[str], list[str]]:
    """The streamed answer's non-empty lines (the first read, then the abort sent, then the rest),
    and the ids the abort ended."""
    with requests.post(srv.base + path, json={**body, "stream": True}, stream=True, timeout=30) as r:
        assert r.status_code == 200, r.text
        lines = (line for line in r.iter_lines(decode_unicode=True) if line)
        got = [next(lines)]
        aborted = abort(srv, **abort_body)
        got += list(lines)
    return got, aborted


def test_a_streamed_generate_is_aborted_by_its_rid(slow):
    body = {"text": "abcdef", "rid": "mine", "sampling_params": {"max_new_tokens": 64}}
    lines, aborted = stream_then_abort(slow, "/generate", body, rid="mine")
    assert aborted == ["mine"] and lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    assert last["meta_info"]["finish_reason"] == {"type": "abort", "message": ABORTED}
    assert last["meta_info"]["id"] == "mine" and 1 <= last["meta_info"]["completion_tokens"] < 64
    assert "abcdef".startswith(last["text"][:6])
    assert wait_idle(slow) and slow.engine.aborted == []  # ended by the engine, not by the client


def whole_then_abort(srv, path: str, body: dict[str, Any], **abort_body: Any) -> requests.Response:
    """A whole answer, aborted once the engine runs it."""
    result: list[requests.Response] = []
    t = threading.Thread(target=lambda: result.append(requests.post(srv.base + path, json=body, timeout=30)))
    t.start()
    deadline = time.monotonic() + 10
    while not srv.engine.added:  # (the fake engine took the request: it runs until it is aborted)
        assert time.monotonic() < deadline and t.is_alive(), result
        t.join(0.01)
    abort(srv, **abort_body)
    t.join(30)
    return result[0]


def test_a_whole_generate_and_a_native_request_are_aborted_by_their_ids(slow):
    out = whole_then_abort(slow, "/generate", {"text": "abc", "rid": "g1"}, rid="g1").json()
    assert out["meta_info"]["finish_reason"] == {"type": "abort", "message": ABORTED}
    native = {"text": "abc", "req_id": "n1", "max_dec_len": 64}
    slow.engine.added.clear()
    res = whole_then_abort(slow, "/v1/chat/completions", native, rid="n1").json()
    assert res["finish_reason"] == "abort" and res["req_id"] == "n1" and res["tokens_all_num"] < 64


def test_rids_name_the_engine_requests(srv):
    r = requests.post(srv.base + "/generate", json={"text": ["a", "b"], "rid": ["x", "x"]}, timeout=10)
    assert r.status_code == 400 and "must be different" in r.json()["error"]["message"]
    outs = requests.post(srv.base + "/generate", json={"text": "ab", "rid": "p", "sampling_params": {
        "n": 2, "max_new_tokens": 2}}, timeout=10).json()  # fmt: skip
    assert [o["meta_info"]["id"] for o in outs] == ["p_0", "p_1"]
    assert [c.req_id for c in srv.engine.added] == ["p_0", "p_1"]


def last_data(lines: list[str], back: int = 1) -> Any:
    return json.loads(lines[-back].removeprefix("data: "))


def test_abort_all_in_every_api(slow):
    chat = {"model": "default", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 64}
    lines, aborted = stream_then_abort(slow, "/v1/chat/completions", chat, abort_all=True)
    assert last_data(lines, 2)["choices"][0]["finish_reason"] == "abort" and aborted[0].startswith("chatcmpl-")
    native = {"text": "abc", "max_dec_len": 64}
    frames, _ = stream_then_abort(slow, "/v1/chat/completions", native, abort_all=True)
    assert last_data(frames)["finish_reason"] == "abort" and last_data(frames)["is_end"] == 1
    # no finish reason says "abort" in these two: an error after what was sent
    responses = {"model": "default", "input": "abc", "max_output_tokens": 64}
    events, _ = stream_then_abort(slow, "/v1/responses", responses, abort_all=True)
    assert last_data(events) | {"sequence_number": 0} == {
        "type": "error", "code": "503", "message": ABORTED, "param": None, "sequence_number": 0}  # fmt: skip
    messages = {"model": "default", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 64}
    events, _ = stream_then_abort(slow, "/v1/messages", messages, abort_all=True)
    assert last_data(events)["error"]["message"] == ABORTED
    slow.engine.added.clear()
    whole = whole_then_abort(slow, "/v1/responses", responses, abort_all=True)
    assert whole.status_code == 503 and whole.json()["error"]["message"] == ABORTED
    assert wait_idle(slow)
