"""The native HTTP API's errors over real sockets (CONTRACT §3): every refusal has its status and a
message naming the field or limit — 400, 401, 409, 413, 429, 503, 504 — and an engine error before
or after the first frame ends the request cleanly."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from tests.support.fakes import FakeTokenizer, assert_healthy, stream_lines, wait_idle

TOK = FakeTokenizer()


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
    # a body without a req_id has the fresh one CONTRACT §3 defaults to; a bad req_id has none
    rid = r.json()["req_id"]
    assert rid == "" if field == "req_id" else uuid.UUID(rid)
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


def test_a_request_whose_detokenisation_fails_ends_alone_with_an_error(srv):
    """Its own text is the request's failure: an error frame (or a 500 before any), the engine
    told to stop it, every other request unaffected."""
    srv.tokenizer.poison = frozenset(srv.tokenizer.encode("~"))
    ids = srv.tokenizer.encode("ab~")  # echoed by the fake engine
    frames = stream_lines(srv.url, {"input_ids": ids, "req_id": "d1", "stream": True, "max_dec_len": 8})
    assert frames[-1]["is_end"] == 1 and frames[-1]["error_code"] == 500 and "text" in frames[-1]["error_msg"]
    assert "".join(f["token"] for f in frames) == "ab"
    assert srv.engine.wait_aborted("d1")
    r = requests.post(srv.url, json={"input_ids": ids[2:], "req_id": "d2"}, timeout=10)
    assert r.status_code == 500 and r.json()["error_code"] == 500
    assert_healthy(srv)
