"""vLLM's request extras, served by `mpirun -n 1 spmd_serve` to the official `openai` client:
`skip_special_tokens` false (the answer's special tokens written, streamed and whole alike, as
ServingTokenizer.decode writes them; the eos that stopped a request written only with
include_stop_str_in_output), `bad_words` (never generated: the greedy answer is the free one up to
where it would have completed a banned word, and never holds one), `guided_choice` (every answer
one of the choices), OpenAI's `response_format: json_object` (every answer on its way to one
JSON object, and one whole when it stopped; a schema's string formats and patterns, long maxLengths;
its whitespace) (tool_choice "auto" and guided_regex: test_tools_auto_mpi.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest

from spmd_serve.engine.json_schema import grammar
from spmd_serve.frontend.text.tokenizer import ServingTokenizer
from spmd_serve.sampling_params import JSON_OBJECT
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def client(served_tp1: Path, tmp_path_factory) -> openai.OpenAI:
    with ServerProcess(1, served_tp1, tmp_path_factory.mktemp("logs") / "server.log") as srv:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tok(served_tp1: Path) -> ServingTokenizer:
    return ServingTokenizer.from_model_dir(served_tp1)


def _ids(logprobs_tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in logprobs_tokens]


def test_skip_special_tokens_false_writes_them(client, tok):
    eos, words = tok.eos_token_ids[0], [tok.encode(w)[-1] for w in (" cat", " dog")]
    extra = {"ignore_eos": True, "allowed_token_ids": sorted({eos, *words}), "return_tokens_as_token_ids": True}
    # near-uniform draws over the three allowed ids (seeded: the same draws every run)
    kw = dict(model="default", messages=CHAT, max_tokens=16, temperature=50, seed=3, logprobs=True, top_logprobs=0)
    shown = client.chat.completions.create(**kw, extra_body={**extra, "skip_special_tokens": False}).choices[0]
    ids = _ids([t.token for t in shown.logprobs.content])
    assert eos in ids and set(words) & set(ids), ids
    assert shown.message.content == tok.decode(ids, skip_special_tokens=False)
    assert tok.special_text(eos) in shown.message.content
    stream = client.chat.completions.create(
        **kw, stream=True, extra_body={**extra, "skip_special_tokens": False, "spaces_between_special_tokens": False}
    )
    joined = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert joined == tok.decode(ids, False, spaces_between_special_tokens=False) != shown.message.content
    skipped = client.chat.completions.create(**kw, extra_body=extra).choices[0]
    assert skipped.message.content == tok.decode(ids)  # the default
    stop = dict(model="default", prompt="Hello", max_tokens=4, temperature=0, logit_bias={str(eos): 100})
    texts = [
        client.completions.create(**stop, extra_body={"skip_special_tokens": False, **keep}).choices[0]
        for keep in ({}, {"include_stop_str_in_output": True})
    ]
    assert [(c.text, c.finish_reason) for c in texts] == [("", "stop"), (tok.special_text(eos), "stop")]


def _find(seq: list[int], part: list[int]) -> int:
    """Where `part` first ends inside `seq` (the index of its last id), or -1."""
    n = len(part)
    return next((i + n - 1 for i in range(len(seq) - n + 1) if seq[i : i + n] == part), -1)


@pytest.mark.parametrize("length", [1, 2])
def test_bad_words_are_never_generated(client, tok, length):
    """A word (one token, or two) the free greedy answer writes, banned: the answer is the free one
    up to the token that would have completed it, differs there, and never holds it."""
    kw = dict(model="default", prompt="Once upon a time", max_tokens=24, temperature=0, logprobs=0)
    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}
    free = _ids(client.completions.create(**kw, extra_body=extra).choices[0].logprobs.tokens)
    # a word whose text encodes back to the same ids (so bad_words names exactly these tokens)
    at = next(
        k
        for k in range(1, len(free) - length)
        if (text := tok.decode(free[k : k + length]).strip()).isalpha() and tok.encode(text) == free[k : k + length]
    )
    word = tok.decode(free[at : at + length]).strip()
    banned = client.completions.create(**kw, extra_body={**extra, "bad_words": [word]}).choices[0]
    got = _ids(banned.logprobs.tokens)
    end = _find(free, tok.encode(word))
    assert got[:end] == free[:end] and got[end] != free[end], (word, free, got)
    assert _find(got, tok.encode(word)) == -1 and word not in banned.text.split()


def test_guided_choice_answers_one_of_the_choices(client):
    """vLLM's guided_choice: every sampled answer (chat, streamed or not; a completion continuing its
    prompt) is one of the choices, ended by the model's EOS."""
    choices = ["yes", "no", "not sure"]
    kw = dict(model="default", messages=CHAT, max_tokens=12, temperature=4.0, seed=5, n=8)  # spread
    whole = client.chat.completions.create(**kw, extra_body={"guided_choice": choices})
    assert {c.message.content for c in whole.choices} <= set(choices)
    assert {c.finish_reason for c in whole.choices} == {"stop"} and len({c.message.content for c in whole.choices}) > 1
    stream = client.chat.completions.create(**kw, stream=True, extra_body={"guided_choice": choices})
    texts = ["" for _ in range(8)]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in whole.choices]  # same seeds, same answers
    spaced = [" " + c for c in choices]  # a completion continues the prompt: the word's own space
    comp = client.completions.create(
        model="default", prompt="Is it raining?", max_tokens=12, n=4, seed=2, extra_body={"guided_choice": spaced}
    )
    assert {c.text for c in comp.choices} <= set(spaced) and {c.finish_reason for c in comp.choices} == {"stop"}


def test_json_object_answers_are_json(client, tok):
    """Sampled answers (chat and completions, streamed or not): each token keeps the answer on its way
    to one JSON object, and an answer that stopped is one.  Held to "{", "}" and the EOS as well,
    the only answer left is "{}", then the EOS."""
    fmt, extra = {"type": "json_object"}, {"return_tokens_as_token_ids": True}
    any_object = grammar(JSON_OBJECT)
    for temperature, seed in ((0, 0), (1.0, 1), (1.0, 2), (0.7, 3)):
        kw = dict(model="default", max_tokens=80, temperature=temperature, seed=seed)
        chat = client.chat.completions.create(
            **kw, messages=CHAT, logprobs=True, response_format=fmt, extra_body=extra
        ).choices[0]
        ids = _ids([t.token for t in chat.logprobs.content])
        comp = client.completions.create(
            **kw, prompt="Data:", logprobs=0, extra_body={**extra, "response_format": fmt}
        ).choices[0]
        for text, answer_ids, finish in ((chat.message.content, ids, chat.finish_reason),
                                          (comp.text, _ids(comp.logprobs.tokens), comp.finish_reason)):  # fmt: skip
            state = any_object.step(any_object.start, b"".join(tok.token_bytes(i) for i in answer_ids))
            assert state is not None, text
            assert finish in ("stop", "length") and (finish == "length" or isinstance(json.loads(text), dict)), text
        stream = client.chat.completions.create(**kw, messages=CHAT, response_format=fmt, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == chat.message.content
    held = {"allowed_token_ids": sorted({*tok.encode("{}")[-2:], *tok.eos_token_ids})}
    for how in ({"response_format": fmt}, {"extra_body": {"structured_outputs": {"json_object": True}}}):
        extra_body = {**held, **how.pop("extra_body", {})}
        got = client.chat.completions.create(
            model="default", messages=CHAT, max_tokens=8, temperature=1.0, seed=4, extra_body=extra_body, **how
        ).choices[0]
        assert (got.message.content, got.finish_reason) == ("{}", "stop")


def test_json_schema_answers_keep_to_the_schema(client):
    """response_format json_schema (and vLLM's guided_json): every answer that stopped is one of the
    schema's objects, its properties in order; the greedy one stops; a keyword not built is a 400."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"enum": ["yes", "no"]}, "c": {"type": "boolean"},
                       "d": {"type": ["string", "null"]}},
        "required": ["a", "b", "c"],
    }  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    finished = []
    for temperature, seed, how in ((0, 0, "r"), (1.0, 2, "g"), (1.0, 5, "r"), (0.7, 3, "g")):
        extra = {"response_format": fmt} if how == "r" else {"extra_body": {"guided_json": schema}}
        ask = [{"role": "user", "content": "Describe a cat."}]  # (greedy, the demo model closes the object)
        kw = dict(model="default", messages=ask, max_tokens=60, temperature=temperature, seed=seed)
        got = client.chat.completions.create(**kw, **extra).choices[0]
        if got.finish_reason == "stop":
            value = json.loads(got.message.content)
            assert list(value)[:3] == ["a", "b", "c"] and set(value) <= {"a", "b", "c", "d"}, value
            assert isinstance(value["a"], int) and value["b"] in ("yes", "no") and isinstance(value["c"], bool)
            assert value.get("d") is None or isinstance(value["d"], str)
            finished.append(temperature)
    assert 0 in finished, finished
    # a string's format and pattern: fixed lengths and bounded whitespace, so every answer ends
    held = {"type": "object", "properties": {"day": {"type": "string", "format": "date"}, "code": {
        "type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["day", "code"]}  # fmt: skip
    for seed in range(3):
        kw = dict(model="default", messages=CHAT, max_tokens=256, temperature=1.0, seed=seed)
        got = client.chat.completions.create(**kw, extra_body={"guided_json": held}).choices[0]
        value = json.loads(got.message.content)
        assert got.finish_reason == "stop" and list(value) == ["day", "code"], got
        assert re.fullmatch(r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", value["day"]), value
        assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", value["code"]), value
    # long maxLengths, counted on the stack past their first counts: the answer crosses the count's
    # stretch (a run of 150 letters), or may stop anywhere up to 100 characters
    long = {"type": "object", "properties": {"run": {"type": "string", "pattern": "^[a-z]{150}$", "maxLength": 300},
            "text": {"type": "string", "maxLength": 100}}, "required": ["run", "text"]}  # fmt: skip
    assert grammar(json.dumps(long)).far
    for seed in range(2):
        kw = dict(model="default", messages=CHAT, max_tokens=400, temperature=1.0, seed=seed)
        got = client.chat.completions.create(**kw, extra_body={"guided_json": long}).choices[0]
        value = json.loads(got.message.content)
        assert got.finish_reason == "stop" and re.fullmatch("[a-z]{150}", value["run"]), got
        assert len(value["text"]) <= 100, value
    bad = {"type": "object", "properties": {"e": {"type": "string", "format": "idn-email"}}}
    with pytest.raises(openai.BadRequestError, match="the format 'idn-email' is not supported"):
        client.chat.completions.create(
            model="default",
            messages=CHAT,
            max_tokens=4,
            response_format={**fmt, "json_schema": {"name": "x", "schema": bad}},
        )


def test_a_json_answer_s_whitespace_is_the_request_s(client, tok):
    """Every whitespace token favoured: disable_any_whitespace writes none (whole and streamed alike),
    none given pads, guided_whitespace_pattern "\\n?" writes newlines alone."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["y", "n"]}}, "required": ["a"]}
    blank = [i for i in range(tok.vocab_size) if tok.token_bytes(i) and not tok.token_bytes(i).strip()]
    kw = dict(model="default", messages=CHAT, max_tokens=120, temperature=0, logit_bias={str(i): 20 for i in blank})
    held = {"structured_outputs": {"json": schema, "disable_any_whitespace": True}}
    ok = client.chat.completions.create(**kw, extra_body=held).choices[0]
    assert ok.finish_reason == "stop" and (c := ok.message.content) == json.dumps(json.loads(c), separators=(",", ":"))
    stream = client.chat.completions.create(**kw, stream=True, extra_body=held)
    assert "".join(k.choices[0].delta.content or "" for k in stream if k.choices) == c
    padded = client.chat.completions.create(**kw, extra_body={"structured_outputs": {"json": schema}}).choices[0]
    assert padded.message.content.startswith((" ", "\n")), padded
    lined = client.chat.completions.create(**kw, extra_body={"guided_json": schema, "guided_whitespace_pattern": "\n?"})
    between = re.sub(r'"[^"]*"', "", text := lined.choices[0].message.content)  # (no string holds a quote)
    assert isinstance(json.loads(text), dict) and "\n" in between and not set(between) & set(" \t\r"), text
    with pytest.raises(openai.BadRequestError, match="disable_any_whitespace applies to a JSON answer"):
        client.chat.completions.create(**kw, extra_body={"structured_outputs": {"disable_any_whitespace": True}})


def test_a_named_tool_choice_answers_with_a_call_of_that_function(client):
    """The official client's tools with a named tool_choice: the answer is one call of the function,
    its arguments the function's parameters once it stopped, streamed as the same call; "auto" is a
    400; "required" answers with calls of the tools."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}},
        "required": ["city", "days"]}}}  # fmt: skip
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(
        model="default", messages=CHAT, max_tokens=40, temperature=0.8, seed=7, tools=[weather], tool_choice=named
    )
    got = client.chat.completions.create(**kw).choices[0]
    (call,) = got.message.tool_calls
    assert call.function.name == "get_weather" and call.type == "function" and not got.message.content
    if got.finish_reason == "stop":
        args = json.loads(call.function.arguments)
        assert list(args) == ["city", "days"] and args["city"] in ("Paris", "Rome") and isinstance(args["days"], int)
    pieces, names = [], set()
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                pieces.append(d.function.arguments or "")
                names |= {d.function.name} - {None}
    assert "".join(pieces) == call.function.arguments and names == {"get_weather"}
    with pytest.raises(openai.BadRequestError, match="auto"):
        client.chat.completions.create(**{**kw, "tool_choice": "auto"})
    # "required": a list of calls of any of the tools, whole in the last chunk when streamed
    now = {"type": "function", "function": {"name": "now"}}
    req = {**kw, "tools": [weather, now], "tool_choice": "required", "max_tokens": 60}
    whole = client.chat.completions.create(**req).choices[0]
    got = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []]
    assert whole.finish_reason in ("tool_calls", "length") and (whole.finish_reason == "tool_calls") == bool(got)
    assert all(
        name == "now" and args == {} or name == "get_weather" and set(args) == {"city", "days"} for name, args in got
    )
    last = [c for chunk in client.chat.completions.create(**req, stream=True) for c in chunk.choices][-1]
    assert last.finish_reason == whole.finish_reason
    assert [(c.function.name, json.loads(c.function.arguments)) for c in last.delta.tool_calls or []] == got


def test_tokenize_counts_what_the_completions_count_and_detokenize_reads_back(client, tok):
    """vLLM's /tokenize and /detokenize: a prompt's or chat's ids are the ones a completion's usage
    counts; the pieces are the vocabulary's; the ids read back as the text, special tokens written."""
    import requests

    base = str(client.base_url).removesuffix("/v1/")
    text = "Once upon a time, 你好 🌍"
    ids = requests.post(f"{base}/tokenize", json={"prompt": text, "return_token_strs": True}, timeout=30).json()
    usage = client.completions.create(model="default", prompt=text, max_tokens=1).usage
    assert ids["count"] == len(ids["tokens"]) == usage.prompt_tokens and ids["tokens"] == tok.encode(text, True)
    assert ids["token_strs"] == tok.pieces(ids["tokens"]) and ids["max_model_len"] > ids["count"]
    chat = requests.post(f"{base}/tokenize", json={"model": "default", "messages": CHAT}, timeout=30).json()
    assert (
        chat["count"]
        == client.chat.completions.create(model="default", messages=CHAT, max_tokens=1).usage.prompt_tokens
    )
    assert chat["token_strs"] is None
    back = requests.post(f"{base}/detokenize", json={"tokens": chat["tokens"]}, timeout=30).json()["prompt"]
    assert back == tok.decode(chat["tokens"], skip_special_tokens=False) and tok.special_text(tok.bos_token_id) in back
    bad = requests.post(f"{base}/tokenize", json={"prompt": "x", "messages": CHAT}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    bad = requests.post(f"{base}/detokenize", json={"tokens": [tok.vocab_size]}, timeout=30)
    assert bad.status_code == 400 and "below" in bad.json()["error"]["message"]


def test_chat_echo_repeats_the_assistant_s_last_message(client):
    """vLLM's chat echo: the answer after the last message when the assistant wrote it (an assistant
    prefill continued reads whole), streamed or not; after a user's message, the answer alone."""
    prefill = [*CHAT, {"role": "assistant", "content": "Once upon a time"}]
    kw = dict(model="default", max_tokens=6, temperature=0)
    plain = client.chat.completions.create(messages=prefill, **kw, extra_body={"continue_final_message": True})
    extra = {"continue_final_message": True, "echo": True}
    echoed = client.chat.completions.create(messages=prefill, **kw, extra_body=extra)
    assert echoed.choices[0].message.content == "Once upon a time" + plain.choices[0].message.content
    stream = client.chat.completions.create(messages=prefill, **kw, stream=True, extra_body=extra)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == echoed.choices[0].message.content
    alone = client.chat.completions.create(messages=CHAT, **kw, extra_body={"echo": True}).choices[0].message.content
    assert alone == client.chat.completions.create(messages=CHAT, **kw).choices[0].message.content
