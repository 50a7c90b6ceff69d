"""OpenAI's function tools in chat requests (spmd_serve/frontend/openai/tools.py): the tools and a
history with tool calls reach the chat template as transformers passes them (the prompt ids equal
apply_chat_template's), a named tool_choice holds the answer to the function's parameters and
returns it as a tool call (whole and streamed), "auto" reads the calls out of a free answer in the
template's format (whole and streamed), and what is not built is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_schema import grammar
from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai.format import ChoiceState, Formatter
from spmd_serve.frontend.openai.protocol import OpenAIError, parse_openai
from spmd_serve.frontend.openai.tool_formats import HERMES
from spmd_serve.frontend.openai.tools import MAX_TOOLS
from spmd_serve.frontend.text.tokenizer import ServingTokenizer
from tests.support.fake_tokenizer import FakeTokenizer
from tests.support.hf_tokenizer_dirs import QWEN2_TEMPLATE, write_byte_level_dir

LIMITS = Limits(max_seq_len=4000, max_dec_len=50, model_max_len=5000)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHAT = [{"role": "user", "content": "Weather in Paris?"}]
# Qwen2.5's way of writing an assistant's tool calls (arguments through tojson: an object)
CALLS = (
    "{%- for m in messages %}{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    "{{- '<tool_call>' + c.function.name + ':' }}{{- c.function.arguments | tojson }}{%- endfor %}{%- endif %}"
    "{%- endfor %}"
)


def _parse(tokenizer=None, **body):
    body = {"model": "m", "messages": CHAT, **body}
    return parse_openai("chat", body, tokenizer or FakeTokenizer(), LIMITS, ("m",))


def test_tools_and_a_history_of_calls_reach_the_template_as_transformers_passes_them(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = write_byte_level_dir(tmp_path / "qwen", "qwen2", extra_config={"chat_template": QWEN2_TEMPLATE + CALLS})
    tok, ref = ServingTokenizer.from_model_dir(model, True), transformers.AutoTokenizer.from_pretrained(str(model))
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]  # fmt: skip
    as_hf = [history[0], {**history[1], "tool_calls": [{**call, "function": {**call["function"],
             "arguments": {"city": "Paris"}}}]}, history[2]]  # fmt: skip
    want = ref.apply_chat_template(as_hf, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    assert "get_weather" in want and '<tool_call>get_weather:{"city": "Paris"}' in want
    for choice in ("none", NAMED):
        assert _parse(tok, messages=history, tools=[WEATHER], tool_choice=choice).prompts[0] == tok.encode(want)
    plain = ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert _parse(tok).prompts[0] == tok.encode(plain) != tok.encode(want)


def test_a_named_tool_choice_holds_the_answer_to_the_function_s_parameters():
    req = _parse(tools=[WEATHER], tool_choice=NAMED)
    assert req.tool_function == "get_weather"
    assert json.loads(req.params.json_schema) == WEATHER["function"]["parameters"]
    bare = {"type": "function", "function": {"name": "now"}}  # no parameters: an empty object
    assert json.loads(_parse(tools=[bare], tool_choice={"type": "function", "function": {"name": "now"}})
                      .params.json_schema) == {"type": "object", "properties": {}}  # fmt: skip
    none = _parse(tools=[WEATHER], tool_choice="none")
    assert (none.tool_function, none.params.json_schema) == ("", "")


@pytest.mark.parametrize(
    "body,param,msg",
    [(dict(tools=[WEATHER]), "tool_choice", "template shows it the tools, and this one's does not"),
     (dict(tools=[WEATHER], tool_choice="auto"), "tool_choice", '"auto" (the default with tools) needs'),
     (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}), "tool_choice",
      "one of tools"),
     (dict(tool_choice="auto"), "tool_choice", "needs tools"),
     (dict(tools=[WEATHER], tool_choice="none", parallel_tool_calls="no"), "parallel_tool_calls", "boolean"),
     (dict(tools={"a": 1}, tool_choice="none"), "tools", "list"),
     (dict(tools=[{"type": "function", "function": {"name": "a b"}}], tool_choice="none"), "tools[0]", "1 to 64"),
     (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": [1]}}], tool_choice="none"),
      "tools[0]", "parameters must be an object"),
     (dict(tools=[WEATHER], tool_choice=NAMED, response_format={"type": "json_object"}), "tool_choice", "cannot both"),
     (dict(tools=[WEATHER], tool_choice=NAMED, ignore_eos=True), "tool_choice", "not with ignore_eos"),
     (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
         "d": {"type": "string", "format": "iri"}}}}}], tool_choice={"type": "function", "function": {"name": "f"}}),
      "tool_choice", "the format 'iri' is not supported")],
)  # fmt: skip
def test_what_is_not_built_is_refused_by_name(body, param, msg):
    with pytest.raises(OpenAIError) as e:
        _parse(**body)
    assert (e.value.status, e.value.param) == (400, param) and msg in e.value.msg, e.value.msg


def test_the_answer_comes_back_as_one_tool_call_whole_and_streamed():
    req = _parse(tools=[WEATHER], tool_choice=NAMED, stream=True)
    fmt = Formatter(req, "chatcmpl-1", FakeTokenizer(), "m")
    state = ChoiceState(0, text='{"city": "Paris"}', finish_reason="stop")
    message = fmt.whole([state])["choices"][0]["message"]
    assert message["content"] == "" and len(message["tool_calls"]) == 1
    call = message["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'} and call["type"] == "function"
    assert call["id"].startswith("chatcmpl-tool-")
    streamed = ChoiceState(0)
    chunks = [fmt.chunk([streamed], 0, piece, [], None)["choices"][0] for piece in ("", '{"city": ', '"Paris"}')]
    chunks.append(fmt.chunk([streamed], 0, "", [], "stop")["choices"][0])
    first = chunks[0]["delta"]
    assert first["role"] == "assistant" and first["tool_calls"][0]["function"]["name"] == "get_weather"
    assert first["tool_calls"][0]["id"] == streamed.call_id
    args = "".join(c["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks[:3])
    assert args == '{"city": "Paris"}' and chunks[3] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
    }
    assert all("content" not in c["delta"] for c in chunks)


def test_tool_choice_required_holds_the_answer_to_a_list_of_calls_and_returns_them():
    now = {"type": "function", "function": {"name": "now"}}
    req = _parse(tools=[WEATHER, now], tool_choice="required", stream=True)
    one = _parse(tools=[WEATHER, now], tool_choice="required", parallel_tool_calls=False).params.json_schema
    assert json.loads(one) == {**json.loads(req.params.json_schema), "maxItems": 1}
    g = grammar(req.params.json_schema)
    for text, whole in [('[{"name":"now","parameters":{}}]', True), ('[{"name": "get_weather", "parameters": '
                        '{"city": "Rome"}}, {"name":"now","parameters":{}}]', True), ("[]", False),
                        ('[{"name":"now","parameters":{"x":1}}]', False),
                        ('[{"name":"get_weather","parameters":{}}]', False),
                        ('{"name":"now","parameters":{}}', False)]:  # fmt: skip
        assert complete(g.step(g.start, text.encode())) == whole, text
    fmt = Formatter(req, "chatcmpl-1", FakeTokenizer(), "m")
    text = '[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "now", "parameters": {}}]'
    choice = fmt.whole([ChoiceState(0, text=text, finish_reason="stop")])["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Rome"}),
        ("now", {}),
    ]
    assert len({c["id"] for c in calls}) == 2
    cut = fmt.whole([ChoiceState(0, text=text[:30], finish_reason="length")])["choices"][0]  # no whole list
    assert (cut["message"]["content"], cut["finish_reason"], "tool_calls" in cut["message"]) == (
        text[:30],
        "length",
        False,
    )
    state = ChoiceState(0)
    chunks = []
    for piece, reason in ((text[:20], None), (text[20:], None), ("", "stop")):
        state.text, state.finish_reason = state.text + piece, reason  # (as the handler advances it)
        chunks.append(fmt.chunk([state], 0, piece, [], reason)["choices"][0])
    assert [c["delta"] for c in chunks[:2]] == [{"role": "assistant"}, {}]  # the calls come whole, last
    last = chunks[2]
    assert last["finish_reason"] == "tool_calls" and [d["index"] for d in last["delta"]["tool_calls"]] == [0, 1]
    assert last["delta"]["tool_calls"][0]["function"] == calls[0]["function"]


def test_tool_choice_required_takes_as_many_tools_as_a_request_may_send():
    """Every place whitespace may come shares one run of indentation states (engine/json_grammar.py):
    a run of its own was 22 states each, so 43 such tools passed MAX_STATES and were refused."""
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
            "required": ["city"]}}}
        for i in range(MAX_TOOLS)
    ]  # fmt: skip
    g = grammar(_parse(tools=tools, tool_choice="required").params.json_schema)
    assert len(g.table) < 200 * MAX_TOOLS
    calls = [{"name": "tool_127", "parameters": {"city": "Rome", "days": 3}}, {"name": "tool_0", "parameters": {
        "city": "Oslo", "unit": "f"}}]  # fmt: skip
    for layout in ({}, {"indent": 2}, {"indent": "\t"}, {"separators": (",", ":")}):
        assert complete(g.step(g.start, json.dumps(calls, **layout).encode())), layout
    assert g.step(g.start, b'[{"name": "tool_128"') is None
    assert g.step(g.start, b"[\n" + b" " * 21) is None  # (still at most 20 indents)
    wide = {"type": "object", "properties": {f"p{k}": {"type": "string"} for k in range(12)}}
    many = [{"type": "function", "function": {"name": f"f{i}", "parameters": wide}} for i in range(MAX_TOOLS)]
    with pytest.raises(OpenAIError, match=r"tool_choice \(the tools' parameters as one JSON schema\): .* 20000"):
        _parse(tools=many, tool_choice="required")


def _hermes_tokenizer() -> FakeTokenizer:
    tok = FakeTokenizer()
    tok.chat_template_source = QWEN2_TEMPLATE  # (the model writes <tool_call> blocks)
    return tok


def test_tool_choice_auto_reads_the_calls_out_of_a_free_answer():
    tok = _hermes_tokenizer()
    now = {"type": "function", "function": {"name": "now"}}
    for choice in ({}, {"tool_choice": "auto"}):  # (OpenAI's default with tools)
        req = _parse(tok, tools=[WEATHER, now], stream=True, **choice)
        assert (req.tool_format, req.tool_names, req.params.json_schema) == (HERMES, {"get_weather", "now"}, "")
    assert _parse(tok, tools=[now], parallel_tool_calls=False).max_calls == 1 and req.max_calls is None
    fmt = Formatter(req, "chatcmpl-1", tok, "m")
    text = 'Let me see.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    text += '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    choice = fmt.whole([ChoiceState(0, text=text, finish_reason="stop")])["choices"][0]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert calls == [("get_weather", {"city": "Paris"}), ("now", {})] and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me see.\n"
    only = fmt.whole([ChoiceState(0, text=text[len("Let me see.\n") :], finish_reason="stop")])["choices"][0]["message"]
    assert only["content"] is None and len(only["tool_calls"]) == 2  # no text besides the calls: null
    plain = fmt.whole([ChoiceState(0, text="It is sunny.", finish_reason="stop")])["choices"][0]
    assert (plain["message"], plain["finish_reason"]) == ({"role": "assistant", "content": "It is sunny."}, "stop")
    cut = fmt.whole([ChoiceState(0, text=text[:40], finish_reason="length")])["choices"][0]
    assert (cut["message"]["content"], cut["finish_reason"], "tool_calls" in cut["message"]) == (text[:40], "length",
                                                                                                   False)  # fmt: skip
    # streamed a character at a time: text that may begin a call is held (no chunk), calls come whole
    state, chunks = ChoiceState(0), []
    for k, piece in enumerate(text):
        chunks.append(fmt.chunk([state], 0, piece, [], "stop" if k == len(text) - 1 else None))
    sent = [c["choices"][0] for c in chunks if c is not None]
    assert len(sent) < len(chunks) and sent[0]["delta"]["role"] == "assistant"
    assert "".join(c["delta"].get("content") or "" for c in sent) == "Let me see.\n"
    deltas = [d for c in sent for d in c["delta"].get("tool_calls", [])]
    assert [(d["index"], d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == [
        (0, "get_weather", {"city": "Paris"}), (1, "now", {})]  # fmt: skip
    assert len({d["id"] for d in deltas}) == 2 and sent[-1]["finish_reason"] == "tool_calls"


class _SpecialTags(FakeTokenizer):
    """A tokenizer where <tool_call> and </tool_call> are special tokens (as some models mark them)."""

    TAGS = {"<tool_call>": 3, "</tool_call>": 4}
    special_token_ids = frozenset({*FakeTokenizer.special_token_ids, 3, 4})
    chat_template_source = QWEN2_TEMPLATE

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.TAGS[text]] if text in self.TAGS else super().encode(text, add_special_tokens)


def test_auto_keeps_the_calls_tags_where_they_are_special_tokens():
    """A decode that skips special tokens would drop the tags before they are read: "auto" keeps them
    unless the request says otherwise (vLLM's rule)."""
    assert _parse(_SpecialTags(), tools=[WEATHER]).params.skip_special_tokens is False
    assert _parse(_SpecialTags(), tools=[WEATHER], skip_special_tokens=True).params.skip_special_tokens is True
    assert _parse(_SpecialTags(), tools=[WEATHER], tool_choice="none").params.skip_special_tokens is True
    assert _parse(_hermes_tokenizer(), tools=[WEATHER]).params.skip_special_tokens is True  # (tags as text)
