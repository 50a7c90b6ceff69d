"""The Responses API as data (spmd_serve/frontend/openai/responses_request.py, responses_format.py): input
items become the chat messages a template reads (a turn's calls on its message, outputs as tool
messages, thinking on the turn after it); refusals of the chat parser come back in the Responses
names; and the builder's events, read as a client accumulates them, rebuild its items exactly,
the same whether the answer came in pieces or whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.frontend.openai.body import OpenAIError
from spmd_serve.frontend.openai.responses_format import ResponseBuilder
from spmd_serve.frontend.openai.responses_request import parse, rename

USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}


def test_input_items_become_the_chat_messages():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Wea"}, {"type": "input_text",
                                                                                                "text": "ther?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call", "call_id": "c3", "name": "w", "arguments": "{}"},
    ]  # fmt: skip
    chat = parse({"model": "m", "instructions": "Sys.", "input": items, "max_output_tokens": 9}).chat
    call = {"type": "function", "function": {"name": "w", "arguments": "{}"}}
    assert chat["messages"] == [
        {"role": "system", "content": "Sys."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "hm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"x": 1}'}},
            {"id": "c2", **call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c3", **call}]},
    ]  # fmt: skip
    assert chat["max_tokens"] == 9 and chat["stream"] is False


def test_tools_choice_and_format_become_chat_fields():
    tool = {"type": "function", "name": "w", "description": "d", "parameters": {"type": "object"}, "strict": True}
    fmt = {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}
    req = parse({"model": "m", "input": "x", "tools": [tool], "tool_choice": {"type": "function", "name": "w"},
                 "text": {"format": fmt}, "top_k": 3})  # fmt: skip
    assert req.chat["tools"] == [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}]
    assert req.chat["tool_choice"] == {"type": "function", "function": {"name": "w"}} and req.chat["top_k"] == 3
    assert req.chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {k: fmt[k] for k in fmt if k != "type"},
    }
    assert (req.echo["tools"], req.echo["text"], req.echo["tool_choice"]) == ([tool], {"format": fmt}, req.chat[
        "tool_choice"] and {"type": "function", "name": "w"})  # fmt: skip


def test_reasoning_effort_is_chats_and_echoed():
    req = parse({"model": "m", "input": "x", "reasoning": {"effort": "low", "summary": None}})
    assert req.chat["reasoning_effort"] == "low" and req.echo["reasoning"] == {"effort": "low", "summary": None}
    assert "reasoning_effort" not in parse({"model": "m", "input": "x", "reasoning": {}}).chat
    for bad in ({"summary": "auto"}, "low"):
        with pytest.raises(OpenAIError) as e:
            parse({"model": "m", "input": "x", "reasoning": bad})
        assert e.value.param == "reasoning" and "no summary here" in e.value.msg


@pytest.mark.parametrize(
    "chat_param, msg, expected",
    [
        (
            "max_tokens",
            "max_tokens(9) exceeds the limit",
            ("max_output_tokens(9) exceeds the limit", "max_output_tokens"),
        ),
        ("response_format.json_schema.schema", "bad", ("bad", "text.format.schema")),
        ("tools[3].function.parameters", "x", ("x", "tools[3].parameters")),
        ("messages", "invalid messages", ("invalid messages", "input")),
        (
            "reasoning_effort",
            "reasoning_effort must be one of",
            ("reasoning.effort must be one of", "reasoning.effort"),
        ),
        (None, "plain", ("plain", None)),
    ],
)
def test_chat_refusals_are_renamed(chat_param, msg, expected):
    assert rename(msg, chat_param) == expected


TEXTS = st.lists(st.sampled_from(["a", "bc", " "]), max_size=3)
CALL = st.tuples(st.sampled_from(["f", "g"]), st.lists(st.sampled_from(["{", "}", '"x"']), max_size=3))


def call_deltas(calls: list[tuple[str, list[str]]]) -> list[dict]:
    """Chat's tool-call deltas: one naming each call, then its arguments in pieces."""
    out: list[dict] = []
    for j, (name, args) in enumerate(calls):
        out.append({"index": j, "id": f"call{j}", "type": "function", "function": {"name": name, "arguments": ""}})
        out += [{"index": j, "function": {"arguments": a}} for a in args]
    return out


def accumulate(events: list[dict]) -> list[dict]:
    """The items as a client builds them from the events alone."""
    items: dict[int, dict] = {}
    for e in events:
        if e["type"] == "response.output_item.added":
            assert e["output_index"] not in items
            items[e["output_index"]] = {**e["item"], "content": []} if "content" in e["item"] else dict(e["item"])
        elif e["type"] == "response.content_part.added":
            items[e["output_index"]]["content"].append(dict(e["part"]))
        elif e["type"] in ("response.output_text.delta", "response.reasoning_text.delta"):
            items[e["output_index"]]["content"][e["content_index"]]["text"] += e["delta"]
        elif e["type"] == "response.function_call_arguments.delta":
            items[e["output_index"]]["arguments"] += e["delta"]
        elif e["type"] == "response.output_item.done":
            assert items[e["output_index"]]["id"] == e["item"]["id"]
            items[e["output_index"]]["status"] = e["item"]["status"]
            assert items[e["output_index"]] == e["item"]
    return [items[i] for i in sorted(items)]


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


@settings(max_examples=200, deadline=None)
@given(thinking=TEXTS, text=TEXTS, calls=st.lists(CALL, max_size=3), finish=st.sampled_from(["stop", "length"]))
def test_events_rebuild_the_items_and_pieces_equal_the_whole(thinking, text, calls, finish):
    """An answer as it streams (thinking, then text, then calls, each in pieces) and the same answer whole."""
    out = ResponseBuilder("resp_1", "m", {})
    events = out.begin()
    deltas = call_deltas(calls)
    for piece in [(t, "", []) for t in thinking] + [("", t, []) for t in text] + [("", "", [d]) for d in deltas]:
        events += out.add(*piece)
    events += out.end(finish, {"input_tokens": 1})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == ("response.incomplete" if finish == "length" else "response.completed")
    assert accumulate(events) == out.items == events[-1]["response"]["output"] and out.items
    assert sum(e["type"] == "response.output_item.done" for e in events) == len(out.items)
    kinds = ["reasoning"] * any(thinking) + ["message"] * (any(text) or not (any(thinking) or calls))
    assert [i["type"] for i in out.items] == kinds + ["function_call"] * len(calls)
    assert [(i["name"], i["arguments"]) for i in out.items[len(kinds) :]] == [(n, "".join(a)) for n, a in calls]
    assert {i["status"] for i in out.items[:-1]} <= {"completed"}
    assert out.items[-1]["status"] == ("incomplete" if finish == "length" else "completed")
    whole = ResponseBuilder("resp_2", "m", {})
    whole.add("".join(thinking), "".join(text), deltas)
    whole.end(finish, {"input_tokens": 1})
    assert without_ids(whole.items) == without_ids(out.items)
