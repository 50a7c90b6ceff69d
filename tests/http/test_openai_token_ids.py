"""vLLM's return_token_ids over real sockets with a fake engine, to the official `openai` client: the
prompt's ids (per choice for completions, beside the choices for chat) and each choice's answer ids,
whole and streamed (each chunk its new ids, the prompt's in a choice's first chunk) alike; the ids are
the tokenizer's own (/tokenize) and the engine's (the fake echoes its prompt after BOS, so its answer
ids are the prompt's cycled), one per completion token; none unless asked, refused by the native API; and
vLLM's stop_reason."""

from __future__ import annotations

import openai
import pytest
import requests

from tests.support.fake_tokenizer import FakeTokenizer

ASK = {"return_token_ids": True}


@pytest.fixture
def server(make_server):
    srv = make_server(max_dec_len=64)
    srv.client_ = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    return srv


def tokenized(srv, **body) -> list[int]:
    return requests.post(srv.base + "/tokenize", json={"model": "default", **body}, timeout=30).json()["tokens"]


def echoed(prompt: list[int], count: int) -> list[int]:
    """The fake engine's first `count` answer ids for this prompt."""
    return [prompt[1 + i % (len(prompt) - 1)] for i in range(count)]


def test_completions_whole_and_streamed(server):
    client, prompt = server.client_, tokenized(server, prompt="Hello there")
    kw = dict(model="default", prompt="Hello there", max_tokens=7, n=2, seed=1, extra_body=ASK)
    whole = client.completions.create(**kw)
    for c in whole.choices:
        extra = c.model_extra
        assert extra["prompt_token_ids"] == prompt and extra["token_ids"] == echoed(prompt, 7)
        assert FakeTokenizer().decode(extra["token_ids"]) == c.text
    assert whole.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in whole.choices)
    ids: dict[int, list[int]] = {0: [], 1: []}
    firsts: dict[int, list] = {0: [], 1: []}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            ids[c.index] += c.model_extra["token_ids"]
            firsts[c.index].append(c.model_extra.get("prompt_token_ids"))
    assert ids == {c.index: c.model_extra["token_ids"] for c in whole.choices}
    assert all(f[0] == prompt and not any(f[1:]) and len(f) > 2 for f in firsts.values())


def test_chat_whole_and_streamed(server):
    client, messages = server.client_, [{"role": "user", "content": "Say hi"}]
    prompt = tokenized(server, messages=messages)
    kw = dict(model="default", messages=messages, max_tokens=5, extra_body=ASK)
    whole = client.chat.completions.create(**kw)
    assert whole.model_extra["prompt_token_ids"] == prompt
    assert whole.choices[0].model_extra["token_ids"] == echoed(prompt, 5) and whole.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert [c.model_extra.get("prompt_token_ids") for c in chunks[:2]] == [prompt, None]
    assert sum((c.choices[0].model_extra["token_ids"] for c in chunks), []) == echoed(prompt, 5)


def test_echo_and_stop_strings(server):
    """Echo: the answer's ids are the generated ones alone; a stop string: every id the engine made,
    the one that completed the stop too (vLLM's), as many as completion_tokens."""
    client, prompt = server.client_, tokenized(server, prompt="abcabc")
    c = client.completions.create(model="default", prompt="abcabc", max_tokens=6, echo=True, extra_body=ASK)
    assert c.choices[0].text == "abcabcabcabc" and c.choices[0].model_extra["token_ids"] == echoed(prompt, 6)
    c = client.completions.create(model="default", prompt="abcabc", max_tokens=6, stop=["ca"], extra_body=ASK)
    assert c.choices[0].text == "ab" and c.choices[0].model_extra["token_ids"] == echoed(prompt, 4)
    assert c.usage.completion_tokens == 4


def test_held_back_chunks_keep_their_ids(server):
    """Text a stop string may begin is held back, and so are its ids: they come with the next chunk."""
    client, prompt = server.client_, tokenized(server, prompt="abcabd")
    kw = dict(model="default", prompt="abcabd", max_tokens=8, stop=["abx"], extra_body=ASK)
    streamed = [
        (c.choices[0].text, c.choices[0].model_extra["token_ids"]) for c in client.completions.create(**kw, stream=True)
    ]
    assert sum((ids for _, ids in streamed), []) == echoed(prompt, 8)
    assert any(len(ids) > 1 for _, ids in streamed)  # ("ab" held, then sent with the id after it)


def test_none_unless_asked_and_refused_where_not_read(server):
    client = server.client_
    c = client.completions.create(model="default", prompt="hey", max_tokens=2)
    assert "token_ids" not in c.choices[0].model_extra and "prompt_token_ids" not in c.choices[0].model_extra
    c = client.completions.create(model="default", prompt="hey", max_tokens=2, extra_body={"return_token_ids": False})
    assert "token_ids" not in c.choices[0].model_extra
    with pytest.raises(openai.BadRequestError, match="return_token_ids must be a boolean"):
        client.completions.create(model="default", prompt="hey", max_tokens=2, extra_body={"return_token_ids": 1})
    r = requests.post(server.base + "/v1/chat/completions", json={"text": "hey", "return_token_ids": True}, timeout=30)
    assert r.status_code == 400 and "return_token_ids" in r.json()["error_msg"]


def test_stop_reason_names_what_stopped_the_answer(server):
    """vLLM's stop_reason: the stop string, the stop_token_ids id, or null (a length), in the whole
    answer's choices and in a stream's last chunk."""
    client, c_id = server.client_, ord("c") + 3  # (the fake tokenizer's id of "c")
    for extra, text, reason in [
        ({"stop": ["ca"]}, "ab", "ca"),
        ({"extra_body": {"stop_token_ids": [c_id]}}, "ab", c_id),
        ({}, "abcabc", None),
    ]:
        kw = dict(model="default", prompt="abcabc", max_tokens=6, **extra)
        whole = client.completions.create(**kw).choices[0]
        assert (whole.text, whole.model_extra["stop_reason"]) == (text, reason)
        chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True)]
        assert [c.model_extra.get("stop_reason", "absent") for c in chunks][-2:] == ["absent", reason]
        chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "abcabc"}],
                                              max_tokens=20, **extra).choices[0]  # fmt: skip
        assert chat.model_extra["stop_reason"] == reason


def test_a_speculative_steps_ids_end_at_the_stop(server):
    """A step that accepts several tokens (speculative decoding) and completes a stop string with its
    first: the ids after it are not the answer's ids, logprobs or completion tokens (whole or streamed)."""
    server.engine.tokens_per_step = 3  # "abc" then "abc": "ca" is complete at the second step's first token
    client, prompt = server.client_, tokenized(server, prompt="abcabc")
    kw = dict(model="default", prompt="abcabc", max_tokens=9, stop=["ca"], logprobs=1, extra_body=ASK)
    whole = client.completions.create(**kw)
    c = whole.choices[0]
    assert (c.text, c.model_extra["token_ids"], whole.usage.completion_tokens) == ("ab", echoed(prompt, 4), 4)
    assert len(c.logprobs.tokens) == 4
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert sum((ch.choices[0].model_extra["token_ids"] for ch in chunks if ch.choices), []) == echoed(prompt, 4)
    assert sum(len(ch.choices[0].logprobs.tokens) for ch in chunks if ch.choices) == 4
    assert chunks[-1].usage.completion_tokens == 4
