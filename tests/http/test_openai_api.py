"""The OpenAI routes over real sockets with a fake engine (fast, no MPI): the official client's
shapes, SSE framing, API key, a client that disconnects, an engine failure mid-stream, and
the per-choice seeds of n > 1."""

import json

import openai
import pytest
import requests

from tests.support.fakes import FakeTokenizer, echo, wait_idle
from tests.support.hf_tokenizer_dirs import QWEN2_TEMPLATE

TOK = FakeTokenizer()


def sse_events(res: requests.Response) -> list:
    events = []
    for line in res.iter_lines():
        if line:
            assert line.startswith(b"data: ")
            data = line[len(b"data: ") :]
            events.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return events


def test_completion_text_and_usage(srv):
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    r = c.completions.create(model="default", prompt="hello", max_tokens=7)
    assert r.choices[0].text == echo([1] + TOK.encode("hello"), 7)
    assert r.usage.prompt_tokens == 6 and r.usage.completion_tokens == 7
    assert r.choices[0].finish_reason == "length" and r.object == "text_completion"


def test_usage_reports_cached_prompt_tokens_once_per_prompt(srv):
    srv.engine.prefix_cache = True  # the fake engine caches like the real one (tests/support/fakes.py)
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    prompt = "the same long prefix, twice over"
    first = c.completions.create(model="default", prompt=prompt, max_tokens=2)
    again = c.completions.create(model="default", prompt=[prompt, prompt + " and more"], max_tokens=2, n=2)
    n_ids = 1 + len(TOK.encode(prompt))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # each prompt counts once whatever n: (n_ids - 1) rounded to the fake's blocks of 4, then n_ids rounded
    assert again.usage.prompt_tokens_details.cached_tokens == (n_ids - 1) // 4 * 4 + n_ids // 4 * 4


def test_sse_framing_ends_with_done_and_finish_reason_only_last(srv):
    res = requests.post(
        srv.base + "/v1/completions",
        stream=True,
        timeout=10,
        json={"model": "default", "prompt": "abc", "max_tokens": 5, "stream": True, "n": 2},
    )
    assert res.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(res)
    assert events[-1] == "[DONE]"
    for i in (0, 1):
        mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == i]
        assert [m["finish_reason"] for m in mine] == [None] * (len(mine) - 1) + ["length"]
        assert "".join(m["text"] for m in mine) == echo([1] + TOK.encode("abc"), 5)


def test_n_choices_get_distinct_seeds(srv):
    requests.post(
        srv.base + "/v1/completions",
        timeout=10,
        json={"model": "default", "prompt": "x", "max_tokens": 1, "n": 3, "seed": 10},
    )
    seeds = [cmd.params.seed for cmd in srv.engine.added]
    assert len(set(seeds)) == 3 and seeds[0] == 10  # choice 0 keeps the seed: n = 1 draws the same
    assert all(0 <= s < 1 << 63 for s in seeds)


def test_choice_seeds_of_neighbouring_seeds_do_not_overlap():
    from spmd_serve.frontend.common.generation import choice_seed

    # seed + index gave seed 1's choices 1..3 to seed 2's choices 0..2: a sweep drew the same samples
    drawn = [choice_seed(seed, i) for seed in range(200) for i in range(8)]
    assert len(set(drawn)) == len(drawn)
    assert choice_seed((1 << 63) - 1, 5) < 1 << 63 and choice_seed(7, 0) == 7


def test_api_key_guards_openai_routes_but_not_health(make_server):
    h = make_server(api_key="s3cret")
    bad = openai.OpenAI(base_url=h.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="default", prompt="x", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=h.base + "/v1", api_key="s3cret", max_retries=0)
    assert good.completions.create(model="default", prompt="x", max_tokens=2).choices
    assert requests.get(h.base + "/health", timeout=10).status_code == 200


def test_disconnect_mid_stream_aborts_every_choice(srv):
    srv.engine.step_s = 0.05
    res = requests.post(
        srv.base + "/v1/completions",
        stream=True,
        timeout=10,
        json={"model": "default", "prompt": "abc", "max_tokens": 60, "stream": True, "n": 2},
    )
    lines = res.iter_lines()
    next(lines)
    res.close()
    ids = [cmd.req_id for cmd in srv.engine.added]
    assert len(ids) == 2 and all(srv.engine.wait_aborted(i, timeout=2.0) for i in ids)
    assert wait_idle(srv)


def test_engine_failure_mid_stream_is_an_error_event_then_done(srv):
    srv.engine.step_s = 0.01
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    srv.engine.fail_after = {}
    res = requests.post(
        srv.base + "/v1/chat/completions",
        stream=True,
        timeout=10,
        json={"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, "stream": True},
    )
    lines = res.iter_lines()
    first = next(line for line in lines if line)
    srv.engine.fail_after[srv.engine.added[-1].req_id] = 3
    rest = [json.loads(line[6:]) if line[6:] != b"[DONE]" else "[DONE]" for line in lines if line]
    assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
    assert rest[-1] == "[DONE]" and rest[-2]["error"]["code"] == 500
    assert c.completions.create(model="default", prompt="ok", max_tokens=2).choices


def test_engine_failure_before_any_byte_is_a_status(srv):
    srv.engine.fail_after = {}
    orig = srv.engine._step

    def fail_all(seq):
        srv.engine.fail_after[seq.cmd.req_id] = 0
        return orig(seq)

    srv.engine._step = fail_all
    r = requests.post(
        srv.base + "/v1/completions",
        timeout=10,
        json={"model": "default", "prompt": "x", "max_tokens": 3, "stream": True},
    )
    assert r.status_code == 500 and r.json()["error"]["message"] == "fake engine failure"


def test_legacy_doubled_paths(srv):
    c = openai.OpenAI(base_url=srv.base + "/v1/chat/completions", api_key="k", max_retries=0)
    assert c.completions.create(model="default", prompt="ab", max_tokens=2).choices[0].text
    r = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert [m.id for m in c.models.list().data] == ["default"]
    assert c.models.retrieve("default").id == "default"


def test_min_tokens_holds_stop_strings_off_as_vllm_does_min_dec_len_does_not(srv):
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    ask = dict(model="default", prompt="hello", max_tokens=9, stop=["l"])  # the fake engine says "hellohell"
    assert c.completions.create(**ask).choices[0].text == "he"
    r = c.completions.create(**ask, extra_body={"min_tokens": 4})  # "hell" ends nothing; the next "l" does
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("hellohe", "stop")
    native = requests.post(
        srv.base + "/v1/chat/completions",
        json={"input_ids": TOK.encode("hello"), "max_dec_len": 9, "stop_sequences": ["l"], "min_dec_len": 4},
        timeout=10,
    ).json()
    assert native["result"] == "he"  # the native min_dec_len holds off EOS only (the original tool's)


def test_models_retrieve_and_unknown_openai_paths(make_server):
    h = make_server(model_names=("org/llama-1b", "default"))
    c = openai.OpenAI(base_url=h.base + "/v1", api_key="k", max_retries=0)
    for name in ("org/llama-1b", "default"):  # a served name may hold "/": the client does not quote it
        m = c.models.retrieve(name)
        assert (m.id, m.object, m.owned_by) == (name, "model", "spmd_serve")
        assert m.model_dump() == next(x for x in c.models.list().model_dump()["data"] if x["id"] == name)
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("nope")
    assert e.value.body["message"] == "The model `nope` does not exist. Served: org/llama-1b, default"
    with pytest.raises(openai.NotFoundError) as e:  # a path the OpenAI API has and we do not
        c.embeddings.create(model="default", input="x")
    assert e.value.body["message"].startswith("no such endpoint: POST /v1/embeddings; this server's OpenAI API is")
    assert e.value.body["type"] == "not_found_error"
    r = requests.post(h.base + "/v1/models", timeout=10)  # a wrong method: the client's error body too
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.get(h.base + "/no/such/path", timeout=10)  # outside /v1/: the native body
    assert r.status_code == 404 and r.json()["error_msg"] == "no such endpoint: GET /no/such/path"
    bad = openai.OpenAI(base_url=make_server(api_key="s3cret").base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.retrieve("default")


def test_more_sequences_than_capacity_is_400_not_429(make_server):
    h = make_server(capacity=4)
    r = requests.post(
        h.base + "/v1/completions",
        timeout=10,
        json={"model": "default", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 1},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert "capacity" in r.json()["error"]["message"]


def test_a_vanishing_temperature_is_greedy():
    from spmd_serve.sampling_params import SamplingParams

    assert SamplingParams(temperature=1e-320).greedy and not SamplingParams(temperature=0.1).greedy


def test_tool_choice_auto_returns_the_calls_the_answer_wrote(make_server):
    """The official client with tools and no tool_choice ("auto"), a model whose template writes
    <tool_call> blocks: the fake engine echoes a prompt holding one, and the answer comes back as the
    call plus the text around it, whole and streamed (a character a step) alike."""
    srv = make_server(max_dec_len=128)
    srv.tokenizer.chat_template_source = QWEN2_TEMPLATE
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    now = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    kw = dict(model="default", messages=[{"role": "user", "content": "Hi" + call}], tools=[now], max_tokens=120)
    kw["stop"] = ["\n<assistant>"]  # (the fake's rendering after the message: the answer stops there)
    whole = c.chat.completions.create(**kw).choices[0]
    assert (whole.message.content, whole.finish_reason) == ("<tools>now\n<user>Hi", "tool_calls")
    assert [(t.function.name, t.function.arguments) for t in whole.message.tool_calls] == [("now", "{}")]
    chunks = [ch.choices[0] for ch in c.chat.completions.create(**kw, stream=True)]
    assert "".join(ch.delta.content or "" for ch in chunks) == whole.message.content
    calls = [t for ch in chunks for t in ch.delta.tool_calls or []]
    assert [(t.index, t.function.name, t.function.arguments) for t in calls] == [(0, "now", "{}")]
    assert chunks[-1].finish_reason == "tool_calls" and calls[0].id.startswith("chatcmpl-tool-")
