"""The official `openai` client, unmodified, against `mpirun -n 2 spmd_serve` on the demo model:
completions and chat, streaming and not, with `base_url=.../v1` and with the original docs'
`base_url=.../v1/chat/completions`; seeds, n, usage, logprobs, echo, greedy settings, logit_bias,
allowed_token_ids and min_p honoured, errors before any SSE byte, and a healthy server after every
error."""

from __future__ import annotations

import math

import openai
import pytest
import requests

from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
CHAT = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def server(served_tp2, tmp_path_factory):
    with ServerProcess(
        2, served_tp2, tmp_path_factory.mktemp("logs") / "server.log", MAX_SEQ_LEN="200", MAX_DEC_LEN="64"
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def base(server) -> str:
    return f"http://127.0.0.1:{server.http_port}"


@pytest.fixture(scope="module", params=["/v1", "/v1/chat/completions"])
def client(request, base) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + request.param, api_key="unused", max_retries=0, timeout=60)


def healthy(base: str) -> None:
    assert requests.get(base + "/v2/health/ready", timeout=10).status_code == 200
    r = requests.post(base + "/v1/chat/completions", json={"text": "ok", "max_dec_len": 2}, timeout=30)
    assert r.status_code == 200 and r.json()["tokens_all_num"] == 2


def test_models_lists_the_served_name_and_default(client):
    names = [m.id for m in client.models.list().data]
    assert "default" in names and len(names) == 2


def test_completion_stream_equals_non_stream_for_a_seed(client):
    kw = dict(
        model="default",
        prompt="Once upon a time",
        max_tokens=12,
        temperature=0.9,
        seed=1234,
        extra_body={"ignore_eos": True},
    )
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert whole.usage.completion_tokens == 12


def test_chat_stream_equals_non_stream_and_usage_chunk(client):
    kw = dict(model="default", messages=CHAT, max_tokens=10, temperature=0.8, seed=7, extra_body={"min_tokens": 10})
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    *content, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 10
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == whole.choices[0].message.content
    assert all(c.usage is None for c in content)
    # vLLM's continuous_usage_stats: every chunk carries the usage so far, the last one the total
    opts = {"include_usage": True, "continuous_usage_stats": True}
    again = list(client.chat.completions.create(stream=True, stream_options=opts, **kw))
    done = [c.usage.completion_tokens for c in again]
    assert done == sorted(done) and done[-1] == 10 and len(set(done)) > 1
    assert {c.usage.prompt_tokens for c in again} == {whole.usage.prompt_tokens}


def test_content_as_text_parts_equals_a_string(client):
    """Text parts are joined by newlines, as vLLM joins them for a template that reads a string."""
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Tell me a story"}, {"type": "text", "text": "about a cat."}],
        }
    ]
    kw = dict(model="default", max_tokens=6, temperature=0, extra_body={"min_tokens": 6})
    a = client.chat.completions.create(messages=parts, **kw)
    b = client.chat.completions.create(messages=[{"role": "user", "content": "Tell me a story\nabout a cat."}], **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_n_two_choices_with_indices(client):
    r = client.chat.completions.create(model="default", messages=CHAT, max_tokens=6, n=2, temperature=1.0, seed=3)
    assert sorted(c.index for c in r.choices) == [0, 1]
    chunks = list(client.completions.create(model="default", prompt="Hi", max_tokens=4, n=2, stream=True, seed=3))
    assert {c.choices[0].index for c in chunks} == {0, 1}
    for i in (0, 1):
        assert [c.choices[0].finish_reason for c in chunks if c.choices[0].index == i][-1]


def test_logprobs_one_per_token_and_exactly_k_top(client):
    r = client.chat.completions.create(
        model="default",
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    for tok in content:
        assert tok.logprob <= 0 and len(tok.top_logprobs) == 3
        tops = [t.logprob for t in tok.top_logprobs]
        assert tops == sorted(tops, reverse=True) and all(t <= 0 for t in tops)
        # greedy without penalties: the chosen token is the distribution's best
        assert math.isclose(tok.logprob, tops[0], abs_tol=1e-6)
    c = client.completions.create(
        model="default",
        prompt="Hello",
        max_tokens=5,
        logprobs=2,
        temperature=0.7,
        seed=11,
        extra_body={"ignore_eos": True},
    )
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(v <= 0 for v in lp.token_logprobs)
    assert "".join(lp.tokens) == c.choices[0].text


def test_return_tokens_as_token_ids_names_every_token(client, served_tp2):
    """vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" (the same values, the
    same text from those ids), so two tokens of one text keep their own top_logprobs keys."""
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    kw = dict(model="default", prompt="Hello", max_tokens=6, logprobs=3, temperature=0)
    plain = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0]
    named = client.completions.create(**kw, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    lp = named.choices[0].logprobs
    assert lp.token_logprobs == plain.logprobs.token_logprobs and named.choices[0].text == plain.text
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert ServingTokenizer.from_model_dir(served_tp2).decode(ids) == plain.text.lstrip()
    assert all(len(top) == 3 and all(k.startswith("token_id:") for k in top) for top in lp.top_logprobs)
    chat = client.chat.completions.create(
        model="default",
        messages=CHAT,
        max_tokens=3,
        logprobs=True,
        top_logprobs=1,
        extra_body={"return_tokens_as_token_ids": True},
    )
    for tok in chat.choices[0].logprobs.content:
        assert tok.token.startswith("token_id:") and bytes(tok.bytes).decode() == tok.token


def test_echo_returns_the_prompt_first(client):
    r = client.completions.create(model="default", prompt="The quick brown fox", max_tokens=4, echo=True, temperature=0)
    assert r.choices[0].text.startswith("The quick brown fox")
    chunks = list(
        client.completions.create(
            model="default", prompt="The quick brown fox", max_tokens=4, echo=True, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].text.startswith("The quick brown fox")
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_continue_final_message_continues_the_last_message(client, served_tp2):
    """vLLM's assistant prefill: the reply continues the last message's text (its end of turn cut),
    the greedy tokens of completing that prompt; asking for a new turn as well is a 400."""
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    msgs = [*CHAT, {"role": "assistant", "content": "Once upon a time, a cat"}]
    extra = {"continue_final_message": True, "ignore_eos": True}
    r = client.chat.completions.create(model="default", messages=msgs, max_tokens=8, temperature=0, extra_body=extra)
    ids = ServingTokenizer.from_model_dir(served_tp2).encode_prompt(messages=msgs, continue_final_message=True)
    c = client.completions.create(
        model="default", prompt=ids, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].message.content == c.choices[0].text and r.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError, match="cannot both be true"):
        client.chat.completions.create(
            model="default", messages=msgs, max_tokens=2, extra_body={**extra, "add_generation_prompt": True}
        )


def test_temperature_zero_and_top_p_zero_are_greedy(client, base):
    greedy = requests.post(
        base + "/v1/chat/completions",
        json={"messages": CHAT, "max_dec_len": 10, "min_dec_len": 10, "temperature": 0},
        timeout=60,
    )
    want = greedy.json()["result"]
    for extra in ({"temperature": 0}, {"top_p": 0, "temperature": 1.5, "seed": 99}):
        r = client.chat.completions.create(
            model="default", messages=CHAT, max_tokens=10, extra_body={"min_tokens": 10}, **extra
        )
        assert r.choices[0].message.content == want, extra
    # min_p = 1 keeps only the most likely token of each step: greedy at any temperature
    r = client.chat.completions.create(
        model="default",
        messages=CHAT,
        max_tokens=10,
        temperature=1.5,
        seed=7,
        extra_body={"min_tokens": 10, "min_p": 1},
    )
    assert r.choices[0].message.content == want


def test_logit_bias_and_allowed_token_ids_ban_and_force_tokens(client, base, served_tp2):
    from spmd_serve.bench.prompts import load_tokenizer

    tok = load_tokenizer(str(served_tp2))
    prompt = tok.encode("Once upon a time")
    native = requests.post(
        base + "/v1/chat/completions",
        json={"input_ids": prompt, "max_dec_len": 4, "min_dec_len": 4, "temperature": 0},
        timeout=60,
    ).json()
    greedy = native["tokens_all_ids"]
    kw_no_extra = dict(model="default", prompt=prompt, max_tokens=4, temperature=0)
    kw = dict(kw_no_extra, extra_body={"ignore_eos": True})
    assert client.completions.create(**kw).choices[0].text == native["result"]
    banned = client.completions.create(logit_bias={str(greedy[0]): -100}, **kw).choices[0].text
    assert banned != native["result"] and not banned.startswith(tok.decode(greedy[:1]))
    forced = greedy[1] if greedy[1] != greedy[0] else greedy[0] + 1
    r = client.completions.create(logit_bias={str(forced): 100}, logprobs=1, **kw)
    assert r.choices[0].text == tok.decode(prompt + [forced] * 4)[len(tok.decode(prompt)) :]
    assert min(r.choices[0].logprobs.token_logprobs) < -0.5  # the model's own, not the biased ones
    only = client.completions.create(extra_body={"ignore_eos": True, "allowed_token_ids": [forced]}, **kw_no_extra)
    assert only.choices[0].text == r.choices[0].text
    # only EOS allowed while min_tokens masks it: refused at admission, not a row of -inf
    with pytest.raises(openai.BadRequestError, match="allowed_token_ids"):
        client.completions.create(extra_body={"allowed_token_ids": tok.eos_token_ids, "min_tokens": 2}, **kw_no_extra)


def test_stop_string_is_trimmed(client):
    text = client.completions.create(
        model="default", prompt="Count", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    text = text.choices[0].text
    stop = text[3:5]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    r = client.completions.create(
        model="default", prompt="Count", max_tokens=12, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_too_long_is_400_before_any_sse_byte(client, base):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=CHAT, max_tokens=1000)
    assert "MAX_DEC_LEN" in str(e.value)
    r = requests.post(
        base + "/v1/completions",
        stream=True,
        timeout=30,
        json={"model": "default", "prompt": "word " * 190, "max_tokens": 60, "stream": True},
    )
    assert r.status_code == 400 and r.headers["Content-Type"].startswith("application/json")
    msg = r.json()["error"]["message"]
    assert msg.startswith("This model's maximum") and "tokens" in msg
    healthy(base)


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"model": "nope", "prompt": "x"}, 404, "model"),
        ({"model": "default", "prompt": "x", "temperature": -1}, 400, "temperature"),
        ({"model": "default", "prompt": "x", "n": 0}, 400, "n"),
        ({"model": "default", "prompt": [], "max_tokens": 2}, 400, "prompt"),
        ({"model": "default", "prompt": "x", "logprobs": 99}, 400, "logprobs"),
        ({"model": "default", "prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ],
)
def test_errors_are_openai_shaped_and_server_stays_healthy(base, body, status, param):
    r = requests.post(base + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]
    healthy(base)
