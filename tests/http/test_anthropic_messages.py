"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over real sockets with a
fake engine, to the official `anthropic` client: the answer is the chat answer for the same
conversation (the fake echoes its prompt), whole, as raw events and through the client's
`messages.stream`; thinking comes back as a thinking block, calls as tool_use blocks; stop reasons,
usage and token counts as Anthropic gives them; what this server does not build is refused by name
with Anthropic's error body; the key is read from x-api-key."""

from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from spmd_serve.frontend.anthropic import request

STOP = ["\n<assistant>"]  # (the fake's rendering after the message: the answer stops there)
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def srv(make_server):
    return make_server(max_dec_len=128)


def client(srv, key: str = "k") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.base, api_key=key, max_retries=0)


def chat(srv, messages: list, **kw):
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="k", max_retries=0)
    return c.chat.completions.create(model="default", messages=messages, **kw)


def blocks(message) -> list[dict]:
    """A message's content blocks as data (the client reads a streamed text block as its parsed kind)."""
    return [b.model_dump(exclude_none=True) for b in message.content]


def test_the_answer_is_the_chat_answer_whole_and_streamed(srv):
    c = client(srv)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    kw = dict(model="default", system=system, messages=HI, max_tokens=100, stop_sequences=STOP)
    whole = c.messages.create(**kw)
    same = chat(srv, [{"role": "system", "content": "Be brief."}, *HI], max_tokens=100, stop=STOP)
    assert [(b.type, b.text) for b in whole.content] == [("text", same.choices[0].message.content)]
    assert (whole.type, whole.role, whole.id[:4], whole.stop_reason, whole.stop_sequence) == (
        "message", "assistant", "msg_", "stop_sequence", STOP[0])  # fmt: skip
    u = whole.usage
    assert (u.input_tokens + u.cache_read_input_tokens, u.output_tokens) == (
        same.usage.prompt_tokens, same.usage.completion_tokens)  # fmt: skip
    events = list(c.messages.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == whole.content[0].text
    with c.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})


def test_stop_reasons_and_prefill(srv):
    c = client(srv)
    cut = c.messages.create(model="default", messages=HI, max_tokens=3)
    assert (cut.stop_reason, cut.content[0].text, cut.usage.output_tokens) == ("max_tokens", "<us", 3)
    prefilled = [*HI, {"role": "assistant", "content": "Hello"}]  # (the answer continues the last turn)
    got = c.messages.create(model="default", messages=prefilled, max_tokens=100, stop_sequences=STOP)
    same = chat(srv, prefilled, max_tokens=100, stop=STOP, extra_body={"continue_final_message": True,
                                                                        "add_generation_prompt": False})  # fmt: skip
    assert got.content[0].text == same.choices[0].message.content


def test_thinking_is_a_block_before_the_text(srv):
    srv.tokenizer.chat_template_source = "{{ messages }}</think>"
    c = client(srv)
    turns = [{"role": "user", "content": "plan</think>answer"}, {"role": "assistant", "content": "<think>"}]
    got = c.messages.create(model="default", messages=turns, max_tokens=100, stop_sequences=STOP)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in got.content] == [
        ("thinking", "<user>plan"), ("text", "answer")]  # fmt: skip
    with c.messages.stream(model="default", messages=turns, max_tokens=100, stop_sequences=STOP) as stream:
        assert blocks(stream.get_final_message()) == blocks(got)
    assert srv.engine.added[-1].params.think_budget == -1
    # budget_tokens: chat's thinking_token_budget, the block the prompt opened closed after so many tokens
    thinking = {"type": "enabled", "budget_tokens": 7}
    c.messages.create(model="default", messages=turns, max_tokens=100, stop_sequences=STOP, thinking=thinking)
    assert (srv.engine.added[-1].params.think_budget, srv.engine.added[-1].params.think_inside) == (7, True)


def test_tool_use_blocks_and_tool_results(srv):
    srv.tokenizer.chat_template_source = "<tool_call>"  # (a template that writes Hermes calls)
    c = client(srv)
    now = {"name": "now", "description": "the time", "input_schema": {"type": "object", "properties": {}}}
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    kw = dict(model="default", tools=[now], max_tokens=120, stop_sequences=STOP)
    got = c.messages.create(messages=[{"role": "user", "content": "ok" + call}], **kw)
    assert [b.type for b in got.content] == ["text", "tool_use"]
    assert (got.stop_reason, got.stop_sequence) == ("tool_use", None)  # (it stopped on its calls)
    use = got.content[1]
    assert (use.name, use.input, use.id[:14]) == ("now", {}, "chatcmpl-tool-")
    with c.messages.stream(messages=[{"role": "user", "content": "ok" + call}], **kw) as stream:
        streamed = blocks(stream.get_final_message())
    assert [{k: v for k, v in b.items() if k != "id"} for b in streamed] == [  # (each call its own id)
        {k: v for k, v in b.items() if k != "id"} for b in blocks(got)]  # fmt: skip
    history = [
        {"role": "user", "content": "t?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "noon"},
                                     {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]},
    ]  # fmt: skip
    call = {"id": use.id, "type": "function", "function": {"name": "now", "arguments": "{}"}}
    assert request.parse({"model": "m", "max_tokens": 9, "messages": history, "tools": [now]}).chat == {
        "model": "m",
        "max_tokens": 9,
        "tools": [
            {
                "type": "function",
                "function": {"name": "now", "parameters": now["input_schema"], "description": "the time"},
            }
        ],
        "messages": [
            {"role": "user", "content": "t?"},
            {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "hm"},
            {"role": "tool", "tool_call_id": use.id, "content": "noon"},
            {"role": "user", "content": "thanks"},
        ],
    }  # fmt: skip  (the chat request the history asks for; the fake tokenizer renders no tool turns)


def test_newer_fields(srv):
    """The current client's top-level cache_control (a no-op here), thinking display omitted (no
    thinking block), output_config's JSON schema (chat's response_format)."""
    srv.tokenizer.chat_template_source = "{{ messages }}</think>"
    c = client(srv)
    turns = [{"role": "user", "content": "plan</think>answer"}, {"role": "assistant", "content": "<think>"}]
    kw = dict(model="default", messages=turns, max_tokens=100, stop_sequences=STOP, cache_control={"type": "ephemeral"})
    got = c.messages.create(**kw, thinking={"type": "adaptive", "display": "omitted"})
    assert [(b.type, b.text) for b in got.content] == [("text", "answer")]
    assert request.parse({"model": "m", "max_tokens": 3, "messages": HI, "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object"}}}}).chat["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}}  # fmt: skip


def test_count_tokens_is_the_prompt_served(srv):
    c = client(srv)
    counted = c.messages.count_tokens(model="default", system="Be brief.", messages=HI)
    served = c.messages.create(model="default", system="Be brief.", messages=HI, max_tokens=1)
    assert counted.input_tokens == served.usage.input_tokens + served.usage.cache_read_input_tokens > 5
    long = [{"role": "user", "content": "word " * 400}]  # (beyond the server's context: it is still counted)
    with pytest.raises(anthropic.BadRequestError, match="maximum context length"):
        c.messages.create(model="default", messages=long, max_tokens=1)
    assert c.messages.count_tokens(model="default", messages=long).input_tokens > 2000


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"mcp_servers": [{"url": "x"}]}, "mcp_servers: not supported"),
        ({"frobnicate": 1}, "frobnicate: Extra inputs are not permitted"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool web_search_20250305"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image blocks are not"),
        ({"thinking": {"type": "enabled"}}, "thinking must be"),
        ({"thinking": {"type": "between_tools"}}, "thinking must be"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2**31}}, "thinking.budget_tokens must be an integer in"),
        ({"speed": "fast"}, 'speed: "fast" is not supported'),
        ({"inference_geo": "us"}, "inference_geo: not supported"),
        ({"output_config": {"effort": "high"}}, "no effort here"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}},
            "output_config.format.type 'nonsense'",
        ),
        ({"tool_choice": {"type": "tool"}}, "tool_choice must be"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"model": "other"}, "other"),
    ],
)
def test_what_is_not_built_is_refused_by_name(srv, fields, words):
    body = {"model": "default", "messages": HI, "max_tokens": 5, **fields}
    r = requests.post(srv.base + "/v1/messages", json={k: v for k, v in body.items() if v is not None}, timeout=30)
    assert r.status_code in (400, 404) and r.json()["type"] == "error", r.text
    assert words in r.json()["error"]["message"], r.text


def test_the_key_is_read_from_x_api_key(make_server):
    srv = make_server(api_key="sesame")
    assert client(srv, "sesame").messages.create(model="default", messages=HI, max_tokens=2).content
    with pytest.raises(anthropic.AuthenticationError) as e:
        client(srv, "wrong").messages.create(model="default", messages=HI, max_tokens=2)
    assert e.value.body["error"]["type"] == "authentication_error"
