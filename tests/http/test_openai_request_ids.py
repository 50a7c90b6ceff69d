"""vLLM's request_id and X-Request-Id, and cache_salt's checks, over real sockets with a fake engine
and the official `openai` client: the answer's id is its prefix and the header's id, else the body's,
whole and in every streamed chunk; the engine's ids stay the server's own (two requests of one id both
answer); too long or not a string is a 400 naming it; a cache_salt reaches the engine (from chat and
the Responses API).  (What a salt does to the prefix cache is
tests/unit/test_prefix_cache.py's and tests/mpi/test_prefix_cache_mpi.py's.)"""

from __future__ import annotations

import concurrent.futures

import openai
import pytest
import requests


@pytest.fixture
def client(make_server) -> openai.OpenAI:
    srv = make_server(max_dec_len=64)
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    client.engine_ = srv.engine
    return client


CHAT = dict(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=3)


def test_the_answer_is_named_by_the_request(client):
    assert client.chat.completions.create(**CHAT, extra_body={"request_id": "abc"}).id == "chatcmpl-abc"
    c = client.completions.create(model="default", prompt="x", max_tokens=2, extra_body={"request_id": "r 1"})
    assert c.id == "cmpl-r 1"
    chunks = list(client.chat.completions.create(**CHAT, stream=True, extra_body={"request_id": "s"}))
    assert {ch.id for ch in chunks} == {"chatcmpl-s"} and len(chunks) > 2
    named = client.with_options(default_headers={"X-Request-Id": "from-header"})
    assert named.chat.completions.create(**CHAT, extra_body={"request_id": "body"}).id == "chatcmpl-from-header"
    assert client.chat.completions.create(**CHAT, extra_body={"request_id": ""}).id.startswith("chatcmpl-")
    plain = client.chat.completions.create(**CHAT).id
    assert plain.startswith("chatcmpl-") and len(plain) > len("chatcmpl-") + 16


def test_one_id_twice_at_once_both_answer(client):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(client.chat.completions.create, **{**CHAT, "max_tokens": 20},
                               extra_body={"request_id": "same"}) for _ in range(2)]  # fmt: skip
        answers = [f.result(timeout=30) for f in futures]
    assert [a.id for a in answers] == ["chatcmpl-same"] * 2
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content != ""
    assert len({cmd.req_id for cmd in client.engine_.added}) == 2


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"request_id": "x" * 257}, "request_id must be at most 256 characters, got 257"),
        ({"request_id": 5}, "request_id must be a string, got 5"),
        ({"cache_salt": ""}, "cache_salt must be a non-empty string if provided"),
        ({"cache_salt": ["s"]}, "cache_salt must be a string"),
        ({"cache_salt": "s" * 1025}, "cache_salt must be at most 1024 characters, got 1025"),
    ],
)
def test_bad_ids_and_salts_are_refused_by_name(client, extra, match):
    with pytest.raises(openai.BadRequestError, match=match) as e:
        client.chat.completions.create(**CHAT, extra_body=extra)
    assert e.value.body["param"] == next(iter(extra))


def test_a_salted_request_answers_and_a_long_header_is_refused(client):
    c = client.chat.completions.create(**CHAT, extra_body={"cache_salt": "tenant-1"})
    assert c.choices[0].message.content and client.engine_.added[-1].params.cache_salt == "tenant-1"
    client.responses.create(model="default", input="hi", max_output_tokens=3, extra_body={"cache_salt": "t2"})
    assert client.engine_.added[-1].params.cache_salt == "t2"  # (the Responses API hands it on)
    r = requests.post(str(client.base_url) + "chat/completions", json=CHAT,
                      headers={"X-Request-Id": "h" * 257}, timeout=30)  # fmt: skip
    assert r.status_code == 400 and "X-Request-Id header must be at most 256" in r.json()["error"]["message"]
    body = {"model": "default", "input": "hi", "max_output_tokens": 2}
    r = requests.post(str(client.base_url) + "responses", json=body, headers={"X-Request-Id": "h" * 257}, timeout=30)
    assert r.status_code == 200 and r.json()["id"].startswith("resp_")  # (a route that names its own answers)
