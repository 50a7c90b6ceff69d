"""tool_choice "auto", vLLM's guided_regex, guided_grammar and structural_tag, served by `mpirun -n 1 spmd_serve`
(the demo model with Qwen2.5's chat template beside its weights) to the official `openai` client: the calls an
answer writes come back as tool calls, whole and streamed alike; a guided_regex answer is one match of its
pattern, ended by the EOS where the pattern may end, a guided_grammar answer a sentence of its
grammar, and a structural tag's answer free text whose every trigger opens a whole structure;
the client's `parse` with a pydantic model of
bounded numbers, a tuple and a discriminated union gets an instance of it back."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import anthropic
import openai
import pytest
import requests

from tests.support.hf_tokenizer_dirs import QWEN2_TEMPLATE, THINKING
from tests.support.pydantic_models import Review
from tests.support.server_process import ServerProcess
from tests.support.structural_oracle import StructuralOracle

pytestmark = pytest.mark.mpi
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def client(served_tp1: Path, tmp_path_factory) -> openai.OpenAI:
    model = shutil.copytree(served_tp1, tmp_path_factory.mktemp("qwen") / "qwen-template")
    (model / "chat_template.jinja").write_text(QWEN2_TEMPLATE + THINKING)
    with ServerProcess(1, model, tmp_path_factory.mktemp("logs") / "server.log") as srv:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="x", max_retries=0, timeout=60)


def test_tool_choice_auto_reads_the_calls_out_of_the_answer(client):
    """The official client's tools with no tool_choice. The answer is held by guided_choice to a
    call, or to a sentence and a call, so what the model writes is known; each comes back as that call and
    the text around it, whole and streamed alike. A tool the request did not name stays text."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    kw = dict(model="default", messages=CHAT, max_tokens=200, temperature=0, tools=[weather])
    for answer, content in [(call, None), ("Let me look.\n" + call, "Let me look.\n")]:
        got = client.chat.completions.create(**kw, extra_body={"guided_choice": [answer]}).choices[0]
        assert (got.message.content, got.finish_reason) == (content, "tool_calls")
        assert [(c.function.name, json.loads(c.function.arguments)) for c in got.message.tool_calls] == [
            ("get_weather", {"city": "Paris"})]  # fmt: skip
        chunks = [c.choices[0] for c in client.chat.completions.create(
            **kw, stream=True, extra_body={"guided_choice": [answer]}) if c.choices]  # fmt: skip
        assert "".join(c.delta.content or "" for c in chunks) == (content or "")
        deltas = [d for c in chunks for d in c.delta.tool_calls or []]
        assert [(d.function.name, d.function.arguments) for d in deltas] == [
            (c.function.name, c.function.arguments) for c in got.message.tool_calls]  # fmt: skip
        assert chunks[-1].finish_reason == "tool_calls"
    other = call.replace("get_weather", "get_time")
    got = client.chat.completions.create(**kw, extra_body={"guided_choice": [other]}).choices[0]
    assert (got.message.content, got.message.tool_calls, got.finish_reason) == (other, None, "stop")


def test_a_thinking_answer_comes_back_apart(client):
    """A prompt left inside a think block (the real tokenizer's decoded tail shows it): each sampled
    answer's thinking is its text up to `</think>` (all of it where it never closes), the rest its
    content, as its raw text (separate_reasoning false) reads, whole and streamed alike; a prompt
    that closes the block leaves the answer content."""
    kw = dict(model="default", messages=CHAT, max_tokens=24, temperature=1.0, seed=11, n=2)

    def answers(thinking: bool, stream: bool = False, **extra) -> list[tuple[str, str | None]]:
        body = {"chat_template_kwargs": {"thinking": thinking}, **extra}
        if not stream:
            got = client.chat.completions.create(**kw, extra_body=body).choices
            return [((c.message.model_extra or {}).get("reasoning", ""), c.message.content) for c in got]
        parts = [["", ""], ["", ""]]
        for chunk in client.chat.completions.create(**kw, extra_body=body, stream=True):
            for c in chunk.choices:
                parts[c.index][0] += (c.delta.model_extra or {}).get("reasoning") or ""
                parts[c.index][1] += c.delta.content or ""
        return [(think, content or None) for think, content in parts]

    for thinking in (True, False):
        raw = [content for _, content in answers(thinking, separate_reasoning=False)]
        think, _, content = zip(*(text.partition("</think>") for text in raw))
        expected = list(zip(think, [c or None for c in content])) if thinking else [("", text) for text in raw]
        assert answers(thinking) == expected and answers(thinking, stream=True) == [
            (t, c or None) for t, c in expected]  # fmt: skip


def test_a_thinking_answer_is_held_to_its_schema_after_the_block(client):
    """response_format json_schema where the prompt opens a think block: the block's text is free (its
    grammar a structural tag's), and the content after it, if the answer got there, is one object of
    the schema; streamed alike."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    kw = dict(model="default", messages=CHAT, max_tokens=32, temperature=1.0, seed=5, n=2, response_format=fmt,
              extra_body={"chat_template_kwargs": {"thinking": True}})  # fmt: skip
    got = client.chat.completions.create(**kw).choices
    for c in got:
        think = c.message.model_extra["reasoning"]
        assert think and "</think>" not in think
        assert (c.message.content, c.finish_reason) == (None, "length") or isinstance(
            json.loads(c.message.content)["n"], int)  # fmt: skip
    streamed = [["", ""], ["", ""]]
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index][0] += (c.delta.model_extra or {}).get("reasoning") or ""
            streamed[c.index][1] += c.delta.content or ""
    assert streamed == [[c.message.model_extra["reasoning"], c.message.content or ""] for c in got]


def test_the_responses_api_answers_as_chat_does(client):
    """/v1/responses to the official client's `responses.create`: the greedy answer is chat's for the same
    conversation, whole and streamed, and a thinking prompt's reasoning item is chat's `reasoning`."""
    for extra in ({}, {"chat_template_kwargs": {"thinking": True}}):
        kw = dict(model="default", max_tokens=12, temperature=0, extra_body=extra)
        chat = client.chat.completions.create(messages=CHAT, **kw).choices[0].message
        kw = dict(model="default", input="Hi", max_output_tokens=12, temperature=0, extra_body=extra)
        got = client.responses.create(**kw)
        thought = [p.text for o in got.output if o.type == "reasoning" for p in o.content]
        assert got.output_text == (chat.content or "") and got.status == "incomplete"
        assert thought == [chat.model_extra["reasoning"]] if extra else not thought
        events = list(client.responses.create(**kw, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == got.output_text
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "".join(thought)


WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TURNS = [  # (a call and its result, in the Messages API's shape, and in chat's)
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]},
]
SAME = [TURNS[0], {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]  # fmt: skip


def test_the_messages_api_answers_as_chat_does(client):
    """/v1/messages to the official `anthropic` client, a conversation with a tool call and its result in
    Qwen2.5's template: the greedy answer is chat's for the same messages, whole and streamed; thinking
    (the template's `thinking` variable) comes back as a thinking block, chat's `reasoning`."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"]}}]
    base = str(client.base_url).removesuffix("/v1/")
    messages = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0).messages
    for thinking in (None, {"type": "enabled", "budget_tokens": 1024}):
        variables = {"enable_thinking": True, "thinking": True} if thinking else {}
        extra = {"chat_template_kwargs": variables}
        chat = client.chat.completions.create(
            model="default", messages=SAME, tools=tools, max_tokens=12, temperature=0, extra_body=extra
        )
        kw = dict(model="default", messages=TURNS, tools=[WEATHER], max_tokens=12, extra_body={"temperature": 0})
        kw.update({"thinking": thinking} if thinking else {})
        got = messages.create(**kw)
        answer = chat.choices[0].message
        expect = [("thinking", answer.model_extra["reasoning"])] if thinking else []
        expect += [("text", answer.content)] if answer.content else []
        assert [(b.type, getattr(b, "thinking", None) or b.text) for b in got.content] == expect
        reason = {"length": "max_tokens", "stop": "end_turn", "tool_calls": "tool_use"}[chat.choices[0].finish_reason]
        assert (got.stop_reason, got.usage.output_tokens) == (reason, chat.usage.completion_tokens)
        with messages.stream(**kw) as stream:
            streamed = stream.get_final_message().content
        assert [b.model_dump(exclude_none=True) for b in streamed] == [
            b.model_dump(exclude_none=True) for b in got.content
        ]


def _sampled_answers(client, extra: dict, prompt: str, seed: int, ends: tuple[str, ...] = ("stop",)) -> list[str]:
    """Four sampled chat answers and four completions held by `extra`, each ended by the EOS (or by
    another of `ends`); the chat answers streamed equal to them whole."""
    kw = dict(model="default", max_tokens=64, temperature=1.0, seed=seed, n=4, extra_body=extra)
    chat = client.chat.completions.create(messages=CHAT, **kw).choices
    comp = client.completions.create(prompt=prompt, **kw).choices
    assert {c.finish_reason for c in chat + comp} <= set(ends)
    streamed = ["" for _ in range(4)]
    for chunk in client.chat.completions.create(messages=CHAT, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == [c.message.content for c in chat]
    return [c.message.content for c in chat] + [c.text for c in comp]


@pytest.mark.parametrize("pattern", [r"(yes|no|maybe)", r"[A-Z][a-z]{2,5}-[0-9]{1,3}", r"\d+(\.\d{1,2})?"])
def test_guided_regex_answers_match_the_pattern(client, pattern):
    """Sampled answers (chat and completions, guided_regex and structured_outputs.regex) each match the
    whole pattern and end by the EOS; streamed equals whole; a pattern not built is a 400 naming it."""
    for extra in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
        for text in _sampled_answers(client, extra, "The answer is", seed=4):
            assert re.fullmatch(pattern, text, re.ASCII), (pattern, text)
    with pytest.raises(openai.BadRequestError, match=r"guided_regex: groupref is not supported"):
        client.completions.create(model="default", prompt="x", max_tokens=4, extra_body={"guided_regex": "(a)\\1"})


EXPRESSIONS = """root ::= "(" expr ")" ([-+*] term)?
expr ::= term ([-+*] term){0,3}
term ::= [1-9] [0-9]? | "(" expr ")" | "-" term
"""
EXPRESSIONS_LARK = r"""
start: "(" expr ")" (OP term)?
expr: term (OP term) ~ 0..3
term: /[1-9][0-9]?/ | "(" expr ")" | "-" term
OP: /[-+*]/
"""  # (the same language in Lark's syntax)


def test_guided_grammar_answers_are_sentences_of_the_grammar(client):
    """Sampled answers held to a grammar with nested brackets (guided_grammar in GBNF,
    structured_outputs.grammar in Lark) are each an expression Python's own parser reads, ended by the EOS;
    streamed equals whole; a grammar not built is a 400 naming why."""
    for extra in ({"guided_grammar": EXPRESSIONS}, {"structured_outputs": {"grammar": EXPRESSIONS_LARK}}):
        for text in _sampled_answers(client, extra, "1 + 2 =", seed=5):
            assert re.fullmatch(r"\([-+*()0-9]+", text), text
            ast.parse(text, mode="eval")  # (brackets closed in order: the stack served)
    with pytest.raises(openai.BadRequestError, match=r"guided_grammar: the rules refer back to themselves"):
        client.completions.create(
            model="default",
            prompt="x",
            max_tokens=4,
            extra_body={"guided_grammar": 'root ::= x "a" | "a"\nx ::= root "b"'},
        )
    with pytest.raises(openai.BadRequestError, match=re.escape("guided_grammar (read as Lark: no line begins")):
        client.completions.create(model="default", prompt="x", max_tokens=4, extra_body={"guided_grammar": "start: x"})


# every full stop the model writes opens a structure: ".", one object of this schema, ";"
TAG = {"structures": [{"begin": ".", "end": ";", "schema": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
    "additionalProperties": False}}], "triggers": ["."]}  # fmt: skip


def test_structural_tag_answers_open_a_whole_structure_at_every_trigger(client):
    """Sampled answers held to a structural tag (response_format, the structural_tag extra and
    structured_outputs.structural_tag; the first form and xgrammar's later one): free text in which
    every trigger opens the structure, each whole and its value valid to its schema
    (tests/support/structural_oracle.py), up to the end or, where max_tokens cut the answer, up to
    its last trigger; streamed equals whole; a schema not built is a 400 naming the field."""
    oracle, opened = StructuralOracle(TAG), 0
    ids = requests.post(str(client.base_url).removesuffix("v1/") + "tokenize", timeout=30,
                        json={"prompt": ".", "add_special_tokens": False}).json()["tokens"]  # fmt: skip
    bias = {"logit_bias": {str(ids[-1]): 6}}  # (the demo model writes few full stops of its own)
    later = {
        "type": "triggered_tags",
        "triggers": ["."],
        "tags": [
            {
                "begin": ".",
                "end": ";",
                "content": {"type": "json_schema", "json_schema": TAG["structures"][0]["schema"]},
            }
        ],
    }  # (xgrammar's later form, the same)
    for extra in ({"response_format": {"type": "structural_tag", **TAG}}, {"structural_tag": json.dumps(TAG)},
                  {"structured_outputs": {"structural_tag": json.dumps(TAG)}},
                  {"response_format": {"type": "structural_tag", "format": later}}):  # fmt: skip
        for text in _sampled_answers(client, {**extra, **bias}, "The numbers are", seed=6, ends=("stop", "length")):
            assert oracle.accepts(text.encode()) or oracle.accepts(text[: text.rfind(".")].encode()), text
            opened += len(re.findall(r'\.\s*\{\s*"n"\s*:\s*\d+\s*\}\s*;', text))
    assert opened > 20
    bad = {**TAG, "structures": [{**TAG["structures"][0], "schema": {"type": "object", "if": {}}}]}
    with pytest.raises(openai.BadRequestError, match=r"structural_tag.*the keyword 'if' is not supported"):
        client.completions.create(model="default", prompt="x", max_tokens=4, extra_body={"structural_tag": bad})


def test_the_clients_parse_with_a_pydantic_model_gets_an_instance(client):
    """`client.chat.completions.parse(response_format=Model)`: the client sends the model's strict
    schema (minimum / maximum on a float, prefixItems, oneOf with OpenAPI's discriminator) and
    validates the answer with pydantic; sampled answers are all valid instances."""
    for seed in range(4):
        kw = dict(model="default", messages=CHAT, max_tokens=800, temperature=1.0, seed=seed)
        got = client.chat.completions.parse(**kw, response_format=Review).choices[0]
        assert got.finish_reason == "stop" and isinstance(got.message.parsed, Review), got
        assert 0 <= got.message.parsed.confidence <= 1 and 1 <= got.message.parsed.stars <= 5
