"""OpenAI's function tools in chat requests (spmd_serve/frontend/openai/tools.py): the tools and a
history with tool calls reach the chat template as transformers passes them (the prompt ids equal
apply_chat_template's), a named tool_choice holds the answer to the function's parameters and
returns it as a tool call (whole and streamed), and what is not built is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai.format import ChoiceState, Formatter
from spmd_serve.frontend.openai.protocol import OpenAIError, parse_openai
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
    [(dict(tools=[WEATHER]), "tool_choice", 'tool_choice "auto" is not supported'),
     (dict(tools=[WEATHER], tool_choice="auto"), "tool_choice", '"auto" is not supported'),
     (dict(tools=[WEATHER], tool_choice="required"), "tool_choice", '"required" is not supported'),
     (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}), "tool_choice",
      "one of tools"),
     (dict(tool_choice="auto"), "tool_choice", "needs tools"),
     (dict(tools={"a": 1}, tool_choice="none"), "tools", "list"),
     (dict(tools=[{"type": "function", "function": {"name": "a b"}}], tool_choice="none"), "tools[0]", "1 to 64"),
     (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": [1]}}], tool_choice="none"),
      "tools[0]", "parameters must be an object"),
     (dict(tools=[WEATHER], tool_choice=NAMED, response_format={"type": "json_object"}), "tool_choice", "cannot both"),
     (dict(tools=[WEATHER], tool_choice=NAMED, ignore_eos=True), "tool_choice", "not with ignore_eos"),
     (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
         "d": {"type": "string", "format": "date"}}}}}], tool_choice={"type": "function", "function": {"name": "f"}}),
      "tool_choice", "'format' is not supported")],
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
    }
    assert all("content" not in c["delta"] for c in chunks)
