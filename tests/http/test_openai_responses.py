"""OpenAI's Responses API (`POST /v1/responses`) over real sockets with a fake engine, to the official
`openai` client: the answer is the chat answer for the same conversation (the fake echoes its
prompt), whole, as raw events and through the client's `responses.stream`; thinking comes back as
a reasoning item and calls as function_call items; a cut answer is incomplete; what this server does
not build is refused by name in the Responses API's own names."""

from __future__ import annotations

import openai
import pytest
import requests

from tests.support.fakes import FakeTokenizer

OPENED = "plan</think>answer"  # (with a generation prompt ending in <think>: thinking "<user>plan", text "answer")
STOP = {"stop": ["\n<assistant>"]}  # (the fake's rendering after the message: the answer stops there)


@pytest.fixture
def srv(make_server):
    return make_server(max_dec_len=128)


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)


def streamed(c: openai.OpenAI, **kw) -> tuple[list, object]:
    """The raw events of a streamed response, and the client's own reading of the same stream."""
    events = list(c.responses.create(**kw, stream=True))
    with c.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    return events, final


def test_the_answer_is_the_chat_answer_whole_and_streamed(srv):
    c = client(srv)
    kw = dict(model="default", instructions="Be brief.", input="Hi", max_output_tokens=100, extra_body=STOP)
    whole = c.responses.create(**kw)
    chat = c.chat.completions.create(
        model="default", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=100, stop=STOP["stop"])  # fmt: skip
    assert whole.output_text == chat.choices[0].message.content == "<system>Be brief.\n<user>Hi"
    assert (whole.status, whole.object, whole.id[:5], [o.type for o in whole.output]) == (
        "completed", "response", "resp_", ["message"])  # fmt: skip
    u = whole.usage
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens)  # fmt: skip
    assert (whole.max_output_tokens, whole.instructions, whole.store) == (100, "Be brief.", False)
    events, final = streamed(c, **kw, stream_options={"include_obfuscation": False})
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == events[-1].response.output_text == whole.output_text


def test_an_answer_cut_by_max_output_tokens_is_incomplete(srv):
    c = client(srv)
    whole = c.responses.create(model="default", input="Hello there", max_output_tokens=5)
    assert (whole.status, whole.incomplete_details.reason, whole.output_text) == ("incomplete", "max_output_tokens",
                                                                                  "<user")  # fmt: skip
    assert whole.output[0].status == "incomplete"
    events = list(c.responses.create(model="default", input="Hello there", max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == "<user"


def thinking_model(srv) -> None:
    """The fake as a model whose generation prompt opens a think block (R1-0528's, QwQ's)."""
    tok = srv.tokenizer
    tok.chat_template_source = "{{ messages }}</think>"
    tok.render_chat = lambda *a, **k: FakeTokenizer.render_chat(tok, *a, **k) + "<think>" * k.get(
        "add_generation_prompt", True)  # fmt: skip


def test_thinking_is_a_reasoning_item_before_the_message(srv):
    thinking_model(srv)
    tok, c = srv.tokenizer, client(srv)
    kw = dict(model="default", input=OPENED, max_output_tokens=100, extra_body=STOP)
    whole = c.responses.create(**kw)
    assert [o.type for o in whole.output] == ["reasoning", "message"] and whole.output_text == "answer"
    assert [p.text for p in whole.output[0].content] == ["<user>plan"]
    assert whole.usage.output_tokens_details.reasoning_tokens == len(tok.encode("<user>plan"))
    events, final = streamed(c, **kw)
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == "<user>plan" and final.output_text == "answer"
    shape = [(o.type, o.status, [p.text for p in o.content]) for o in whole.output]
    assert [(o.type, o.status, [p.text for p in o.content]) for o in final.output] == shape
    dropped = c.responses.create(**{**kw, "extra_body": {**STOP, "include_reasoning": False}})
    assert [o.type for o in dropped.output] == ["message"] and dropped.output_text == "answer"


def test_calls_are_function_call_items(srv):
    srv.tokenizer.chat_template_source = "<tool_call>"  # (a template that writes Hermes calls)
    c = client(srv)
    now = {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}}
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    kw = dict(model="default", input="ok" + call, tools=[now], max_output_tokens=120, extra_body=STOP)
    whole = c.responses.create(**kw)
    assert [o.type for o in whole.output] == ["message", "function_call"]
    assert whole.output_text == "<tools>now\n<user>ok"
    fc = whole.output[1]
    assert (fc.name, fc.arguments, fc.call_id[:14], fc.status) == ("now", "{}", "chatcmpl-tool-", "completed")
    events, final = streamed(c, **kw)
    assert [(o.type, getattr(o, "name", None)) for o in final.output] == [("message", None), ("function_call", "now")]
    named = c.responses.create(**{**kw, "tool_choice": {"type": "function", "name": "now"}})
    assert [o.type for o in named.output] == ["function_call"] and named.output[0].name == "now"


def test_logprobs_come_with_the_output_text_whole_and_streamed(srv):
    """include message.output_text.logprobs: the text's tokens' logprobs (chat's, top_logprobs
    alternatives each), in the part, each delta event (its own tokens') and the done event."""
    c = client(srv)
    ask = dict(include=["message.output_text.logprobs"], top_logprobs=2)
    kw = dict(model="default", input="Hi", max_output_tokens=100, extra_body=STOP)
    whole = c.responses.create(**kw, **ask)
    chat = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=100,
                                     stop=STOP["stop"], logprobs=True, top_logprobs=2)  # fmt: skip
    expected = [e.model_dump() for e in chat.choices[0].logprobs.content]
    part = whole.output[0].content[0]
    # (every token the engine made: the stop string's too, as chat's logprobs have them)
    assert [e.model_dump() for e in part.logprobs] == expected and "".join(e["token"] for e in expected) == (
        "<user>Hi\n<assistant>")  # fmt: skip
    assert all(len(e["top_logprobs"]) == 2 for e in expected) and whole.top_logprobs == 2
    events, final = streamed(c, **kw, **ask)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert sum(([lp.model_dump() for lp in e.logprobs] for e in deltas), []) == expected
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.model_dump() for lp in done.logprobs] == expected
    assert [e.model_dump() for e in final.output[0].content[0].logprobs] == expected
    assert c.responses.create(**kw).output[0].content[0].logprobs == []  # (none unless asked)


def test_a_thinking_answers_logprobs_come_with_the_text_after_it(srv):
    thinking_model(srv)
    c = client(srv)
    kw = dict(model="default", input=OPENED, max_output_tokens=100, extra_body=STOP,
              include=["message.output_text.logprobs"])  # fmt: skip
    whole = c.responses.create(**kw)
    tokens = [e.token for e in whole.output[1].content[0].logprobs]
    assert "".join(tokens) == "<user>plan</think>answer\n<assistant>" and whole.output_text == "answer"
    events, _ = streamed(c, **kw)
    streamed_tokens = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert streamed_tokens == tokens


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"store": True}, "store", "keeps no responses"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
        ({"foo": 1}, "foo", "Unrecognized request argument"),
        ({"max_output_tokens": 10**6}, "max_output_tokens", "max_output_tokens"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "text models",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "function_call_output"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "hosted tools"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0]", "tools[0]"),
        ({"text": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}}, "text.format", "schema"),
        ({"text": {"format": {"type": "xml"}}}, "text.format", "json_schema"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort", "chat template reads no"),
        ({"reasoning": {"summary": "auto"}}, "reasoning", "no summary here"),
        ({"metadata": {"a": 1}}, "metadata", "string values"),
        ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options", "not supported"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "'reasoning.encrypted_content' is not supported"),
        ({"include": "message.output_text.logprobs"}, "include", "list of strings"),
        ({"top_logprobs": 3}, "top_logprobs", "needs include"),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
        (
            {"include": ["message.output_text.logprobs"], "tools": [{"type": "function", "name": "f"}]},
            "include",
            "not supported with tools",
        ),
    ],
)
def test_what_is_not_built_is_refused_by_name(srv, fields, param, words):
    body = {"model": "default", "input": "Hi", **fields}
    r = requests.post(srv.base + "/v1/responses", json=body, headers={"Authorization": "Bearer k"}, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]
