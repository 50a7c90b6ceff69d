"""A reasoning model's think block over real sockets with a fake engine, to the official `openai`
client: the fake echoes its prompt, so a prompt that ends inside a think block (an assistant turn
continued after `<think>`) makes an answer that thinks, closes the block and answers; its thinking
comes back as `reasoning` and `reasoning_content`, whole and streamed (a character a step) alike,
dropped or inline as the request asks, never split where a grammar holds the answer, and tool calls
are read out of the answer after the block."""

from __future__ import annotations

import openai
import pytest

TEMPLATE = "{{ messages }}{% if not thinking %}<think>\n\n</think>\n\n{% endif %}"  # (mentions the close)
# the prompt "<user>plan</think>answer\n<assistant><think>": the answer, stopped before its echo of the turn
OPENED = [{"role": "user", "content": "plan</think>answer"}, {"role": "assistant", "content": "<think>"}]
KW = dict(model="default", stop=["\n<assistant>"], extra_body={"continue_final_message": True})


@pytest.fixture
def client(make_server) -> openai.OpenAI:
    srv = make_server(max_dec_len=128)
    srv.tokenizer.chat_template_source = TEMPLATE
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)


def both(client: openai.OpenAI, **kw) -> tuple[dict, dict]:
    """The whole answer's message fields and the streamed deltas' joined ones."""
    kw = {**KW, **kw, "extra_body": {**KW["extra_body"], **kw.get("extra_body", {})}}
    whole = client.chat.completions.create(**kw).choices[0]
    fields = {"content": whole.message.content, "finish": whole.finish_reason, **(whole.message.model_extra or {})}
    joined: dict = {}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for k, v in {"content": c.delta.content, **(c.delta.model_extra or {})}.items():
                joined[k] = joined.get(k, "") + (v or "")
            joined["finish"] = c.finish_reason or joined.get("finish")
    return fields, joined


def test_the_thinking_comes_back_apart_whole_and_streamed(client):
    whole, streamed = both(client, messages=OPENED, max_tokens=100)
    assert whole == {
        "content": "answer",
        "finish": "stop",
        "reasoning": "<user>plan",
        "reasoning_content": "<user>plan",
    }
    assert streamed == whole


def test_an_answer_cut_before_the_close_is_all_thinking(client):
    whole, streamed = both(client, messages=OPENED, max_tokens=5)
    assert whole == {"content": None, "finish": "length", "reasoning": "<user", "reasoning_content": "<user"}
    assert streamed == {**whole, "content": ""}


def test_an_all_thinking_answer_goes_back_into_the_conversation(client):
    """Its message (content null) sent back as it came is an assistant turn with empty content."""
    kw = dict(model="default", stop=["<user>x"], extra_body={"include_stop_str_in_output": True})
    message = client.chat.completions.create(**KW, messages=OPENED, max_tokens=5).choices[0].message
    assert message.content is None
    turns = [OPENED[0], message.model_dump(), {"role": "user", "content": "x"}]
    later = client.chat.completions.create(**kw, messages=turns, max_tokens=60).choices[0].message
    assert later.content == "<user>plan</think>answer\n<assistant>\n<user>x"  # (the fake echoes its prompt)


def test_the_request_may_drop_the_thinking_or_keep_it_inline(client):
    whole, streamed = both(client, messages=OPENED, max_tokens=100, extra_body={"include_reasoning": False})
    assert whole == streamed == {"content": "answer", "finish": "stop"}
    whole, streamed = both(client, messages=OPENED, max_tokens=100, extra_body={"separate_reasoning": False})
    assert whole == streamed == {"content": "<user>plan</think>answer", "finish": "stop"}
    with pytest.raises(openai.BadRequestError) as e:
        both(client, messages=OPENED, max_tokens=100, extra_body={"separate_reasoning": "no"})
    assert e.value.body["param"] == "separate_reasoning"


def test_an_answer_without_a_block_is_content_and_one_held_to_choices_is_never_split(client):
    whole, streamed = both(client, messages=OPENED[:1], max_tokens=100, extra_body={"continue_final_message": False})
    assert whole == streamed == {"content": "<user>plan</think>answer", "finish": "stop"}
    # (the fake engine holds nothing: what it echoes is the answer the grammars would hold)
    choice = {"guided_choice": ["<user>plan</think>answer"]}
    whole, streamed = both(client, messages=OPENED, max_tokens=100, extra_body=choice)
    assert whole == streamed == {"content": "<user>plan</think>answer", "finish": "stop"}
    whole, streamed = both(client, messages=OPENED, max_tokens=100, response_format={"type": "json_object"})
    assert (
        whole
        == streamed
        == {"content": "answer", "finish": "stop", "reasoning": "<user>plan", "reasoning_content": "<user>plan"}
    )  # fmt: skip  (held after the think block)


def test_tool_calls_are_read_after_the_thinking(make_server):
    now = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    srv = make_server(max_dec_len=128)
    srv.tokenizer.chat_template_source = TEMPLATE + "<tool_call>"  # (a template that writes Hermes calls)
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    messages = [{"role": "user", "content": "plan</think>ok" + call}, OPENED[1]]
    kw = {**KW, "messages": messages, "tools": [now], "max_tokens": 120}
    got = c.chat.completions.create(**kw).choices[0]
    assert got.message.model_extra["reasoning"] == "<tools>now\n<user>plan" and got.finish_reason == "tool_calls"
    assert got.message.content == "ok" and [t.function.name for t in got.message.tool_calls] == ["now"]
    chunks = [ch.choices[0] for ch in c.chat.completions.create(**kw, stream=True)]
    assert "".join(ch.delta.model_extra.get("reasoning") or "" for ch in chunks) == "<tools>now\n<user>plan"
    assert "".join(ch.delta.content or "" for ch in chunks) == "ok"
    assert [t.function.name for ch in chunks for t in ch.delta.tool_calls or []] == ["now"]


def test_a_thinking_budget_reaches_the_engine_from_chat_and_responses(make_server):
    """vLLM's thinking_token_budget: the block the prompt opened is cut after so many tokens (the engine
    forces the close tag: tests/unit/test_think_budget.py); the Responses API hands it on as chat's."""
    srv = make_server(max_dec_len=128)
    srv.tokenizer.chat_template_source = TEMPLATE
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    client.chat.completions.create(**{**KW, "extra_body": {**KW["extra_body"], "thinking_token_budget": 3}},
                                   messages=OPENED, max_tokens=10)  # fmt: skip
    params = srv.engine.added[-1].params
    assert (params.think_budget, params.think_inside, params.think_close) == (
        3,
        True,
        tuple(srv.tokenizer.encode("</think>")),
    )
    client.responses.create(model="default", input="hi", max_output_tokens=3, extra_body={"thinking_token_budget": 2})
    assert (srv.engine.added[-1].params.think_budget, srv.engine.added[-1].params.think_inside) == (2, False)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default", prompt="a", max_tokens=3, extra_body={"thinking_token_budget": 2})
    assert e.value.body["param"] == "thinking_token_budget" and "chat's" in e.value.body["message"]
