"""A reasoning model's think block apart from its answer (spmd_serve/frontend/openai/reasoning.py): the
whole answer's (thinking, content) equal a reference reading of the documented rule (a regex over
the text, not the streaming state machine), any split of the answer into streamed pieces gives the
same, nothing is lost but the tags (and spaces before an opening one), and the request's fields
choose split, dropped or inline thinking, refusing a bad value by name; an answer held to a schema,
a pattern or a grammar is held after the think block."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.structural_tag import answer_grammar
from spmd_serve.frontend.openai.body import OpenAIError
from spmd_serve.frontend.openai.fields import FieldError
from spmd_serve.frontend.openai.reasoning import (
    CLOSE,
    DROP,
    OPEN,
    SPLIT,
    ReasoningSplitter,
    after_thinking,
    mode,
    plan,
    prompt_tag,
)
from spmd_serve.sampling_params import SamplingParams
from tests.support.fake_tokenizer import FakeTokenizer

THINKING_TEMPLATE = "{{ messages }}{% if not thinking %}<think>\n\n</think>\n\n{% endif %}"


def reference(text: str, inside: bool) -> tuple[str, str]:
    """The rule as a regex: a block the prompt opened runs to the first CLOSE (or the end); else a
    block counts only where the answer opens it first (after spaces), and runs the same way."""
    m = re.fullmatch(r"(?s)\s*" + re.escape(OPEN) + "(.*)", text)
    if not inside and m is None:
        return "", text
    body = text if inside else m.group(1)
    think, closed, content = body.partition(CLOSE)
    return think, content if closed else ""


def streamed(text: str, cuts: list[int], inside: bool) -> tuple[str, str]:
    splitter, think, content = ReasoningSplitter(inside), "", ""
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        t, c = splitter.feed(text[a:b])
        think, content = think + t, content + c
    t, c = splitter.finish()
    return think + t, content + c


EXAMPLES = [
    ("<think>\nplan</think>\n\nThe answer.", False, ("\nplan", "\n\nThe answer.")),  # Qwen3, the first R1
    ("\n <think>a</think>b", False, ("a", "b")),  # (spaces before the tag are no one's)
    ("plan</think>answer", True, ("plan", "answer")),  # R1-0528, QwQ: the prompt opened it
    ("plan, cut short", True, ("plan, cut short", "")),  # max_tokens before the close: all thinking
    ("The answer.", False, ("", "The answer.")),  # no block
    ("The <think>answer</think>.", False, ("", "The <think>answer</think>.")),  # not at the start: text
    ("<think>a</think>b</think>c", False, ("a", "b</think>c")),  # one block: the first close ends it
    ("<thin", False, ("", "<thin")),  # a tag's start that never became one
    ("<think>", False, ("", "")),
    ("a</thi", True, ("a</thi", "")),
    ("", True, ("", "")),
]


@pytest.mark.parametrize("text, inside, expected", EXAMPLES)
def test_examples_split_as_documented(text, inside, expected):
    assert ReasoningSplitter(inside).split(text) == expected == reference(text, inside)


pieces = st.lists(st.sampled_from(["<", "think", ">", "</", "/", OPEN, CLOSE, "a", " ", "\n", "</th", "ink>"]))


@settings(max_examples=300, deadline=None)
@given(parts=pieces, inside=st.booleans(), data=st.data())
def test_any_streamed_split_equals_the_whole_and_the_rule(parts, inside, data):
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    assert streamed(text, cuts, inside) == ReasoningSplitter(inside).split(text) == reference(text, inside)


def test_held_text_goes_out_as_soon_as_it_cannot_be_a_tag():
    s = ReasoningSplitter(False)
    assert [s.feed(p) for p in ["<", "th", "x", "y"]] == [("", ""), ("", ""), ("", "<thx"), ("", "y")]
    s = ReasoningSplitter(True)
    assert [s.feed(p) for p in ["a<", "/", "b", "</think", ">c"]] == [
        ("a", ""), ("", ""), ("</b", ""), ("", ""), ("", "c")]  # fmt: skip


def test_the_prompt_opens_or_closes_a_block_where_its_generation_prompt_ends_with_the_tag():
    tok = FakeTokenizer()
    assert (
        prompt_tag(tok, tok.encode("<assistant><think>\n")) == prompt_tag(tok, tok.encode("</think>y<think>")) == OPEN
    )
    assert prompt_tag(tok, tok.encode("<assistant><think>\n\n</think>\n\n")) == CLOSE
    assert prompt_tag(tok, tok.encode("<assistant>")) == prompt_tag(tok, tok.encode("<think>a</think>b")) == ""


@pytest.mark.parametrize(
    "body, template, held, expected",
    [
        ({}, THINKING_TEMPLATE, False, SPLIT),
        ({"include_reasoning": False}, THINKING_TEMPLATE, False, DROP),
        ({"separate_reasoning": False}, THINKING_TEMPLATE, False, ""),
        ({}, THINKING_TEMPLATE, True, ""),  # a grammar's answer is never split
        ({}, "{{ messages }}", False, ""),  # the model never thinks
        ({}, None, False, ""),
        ({"include_reasoning": False}, "{{ messages }}", False, ""),
    ],
)
def test_the_request_chooses_split_dropped_or_inline(body, template, held, expected):
    assert mode(body, template, held) == expected


@pytest.mark.parametrize(
    "body, param",
    [
        ({"include_reasoning": "no"}, "include_reasoning"),
        ({"separate_reasoning": 0}, "separate_reasoning"),
        ({"include_reasoning": False, "separate_reasoning": False}, "include_reasoning"),
    ],
)
def test_bad_values_are_refused_by_name_even_where_the_model_does_not_think(body, param):
    for template in (THINKING_TEMPLATE, None):
        with pytest.raises(OpenAIError) as e:
            mode(body, template, False)
        assert e.value.param == param and e.value.status == 400


def _accepts(grammar, data: bytes) -> bool:
    state = grammar.step(grammar.start, data)
    return state is not None and grammar.may_end(state)


SCHEMA = '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'


@pytest.mark.parametrize(
    "params, opens, good, bad",
    [
        (SamplingParams(json_schema=SCHEMA), True, [b'plan {"a": "x"}</think>{"a": 1}', b'</think>\n{"a":1}'],
         [b'{"a": 1}', b'plan</think>{"a": "x"}', b'plan</think>{"a":1}</think>', b"plan"]),
        (SamplingParams(json_schema=SCHEMA), False, [b'<think>\nplan</think>{"a": 1}', b'{"a": 1}'],
         [b'plan</think>{"a":1}', b'<think>plan{"a": 1}', b'{"a": 1}</think>']),
        (SamplingParams(regex="(yes|no)"), True, [b"hm, yes or no?</think>yes", b"</think>no"],
         [b"hm</think>maybe", b"yes", b"hm</think>yes!"]),
        (SamplingParams(gbnf='root ::= "x"+'), True, [b"</think>xxx"], [b"xxx", b"</think>"]),
    ],
)  # fmt: skip
def test_a_held_answer_is_held_after_the_think_block(params, opens, good, bad):
    """The think block's free text first (the one the prompt opened, or one the answer may open),
    then the held format, whole: nothing after it, nothing of it inside the block."""
    grammar = answer_grammar(after_thinking(params, opens, "response_format"))
    assert [_accepts(grammar, d) for d in good + bad] == [True] * len(good) + [False] * len(bad)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(json_schema=SCHEMA, json_whitespace=""), SamplingParams(), SamplingParams(structural_tag="{}")],
)
def test_other_answers_are_not_held_after_thinking(params):
    assert after_thinking(params, True, "response_format") == ""


def test_a_held_form_the_tag_cannot_hold_is_refused_naming_the_field():
    slow: list = []
    after_thinking(SamplingParams(regex="(a"), True, "guided_regex", slow)
    with pytest.raises(FieldError) as e:
        slow[0]()
    assert e.value.param == "guided_regex"


def test_think_tags_that_are_special_tokens_are_kept_in_the_text_to_be_read():
    """A tokenizer that marks `</think>` special: the answer's text keeps special tokens by default (a
    request may still skip them); a model that does not think skips them as before."""
    from spmd_serve.frontend.common.parsing import Limits
    from spmd_serve.frontend.openai.protocol import parse_openai

    class Tagged(FakeTokenizer):  # </think> is one special token
        special_token_ids = frozenset({1, 2, 7})

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [7] if text == CLOSE else super().encode(text, add_special_tokens)

    limits = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)
    for template, skips in ((THINKING_TEMPLATE, False), ("{{ messages }}", True)):
        tok = Tagged()
        tok.chat_template_source = template
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
        assert parse_openai("chat", body, tok, limits, ("m",)).params.skip_special_tokens is skips
        body["skip_special_tokens"] = True
        assert parse_openai("chat", body, tok, limits, ("m",)).params.skip_special_tokens is True


@pytest.mark.parametrize(
    "prompt, body, params, held, expected",
    [
        ("<assistant><think>\n", {"guided_json": {}}, SamplingParams(json_schema=SCHEMA), False, (SPLIT, True, "seq")),
        ("<assistant>", {"guided_json": {}}, SamplingParams(json_schema=SCHEMA), False, (SPLIT, False, "or")),
        ("<think>\n\n</think>\n\n", {"guided_json": {}}, SamplingParams(json_schema=SCHEMA), False, ("", False, "")),
        ("<assistant><think>\n", {"structural_tag": "{}"}, SamplingParams(structural_tag="{}"), False, ("", False, "")),
        ("<assistant><think>\n", {}, SamplingParams(), True, ("", False, "")),
        ("<think>\n\n</think>\n\n", {}, SamplingParams(), False, (SPLIT, False, "")),
        ("<assistant><think>\n", {"separate_reasoning": False}, SamplingParams(regex="a"), False, ("", False, "")),
    ],
)  # fmt: skip
def test_the_plan_follows_the_prompt_and_what_holds_the_answer(prompt, body, params, held, expected):
    """Open block: held after it; none: an optional block first; closed by the template: held from the
    first token (unsplit); choices, tool calls, a request's own structural tag: never split."""
    tok = FakeTokenizer()
    how, opens, out = plan(body, THINKING_TEMPLATE, tok, tok.encode(prompt), params, held)
    form = json.loads(out.structural_tag)["format"]["type"][:3] if out is not params else ""
    assert (how, opens, form) == expected
    assert out is params or not (out.json_schema or out.regex or out.gbnf)


@pytest.mark.parametrize(
    "prompt, body, params, held, template, expected",
    [
        ("<assistant><think>\n", {}, SamplingParams(), False, THINKING_TEMPLATE, (5, True)),
        ("<assistant>", {}, SamplingParams(), False, THINKING_TEMPLATE, (5, False)),  # (the answer may open one)
        ("<assistant><think>\n", {"separate_reasoning": False}, SamplingParams(), False, THINKING_TEMPLATE, (5, True)),
        ("<assistant><think>\n", {"guided_json": {}}, SamplingParams(json_schema=SCHEMA), False, THINKING_TEMPLATE,
         (5, True)),  # (held after the block)
        ("<think>\n\n</think>\n\n", {}, SamplingParams(), False, THINKING_TEMPLATE, (-1, False)),  # (closed)
        ("<assistant><think>\n", {}, SamplingParams(), True, THINKING_TEMPLATE, (-1, False)),  # (held: no block)
        ("<assistant><think>\n", {"separate_reasoning": False}, SamplingParams(regex="a"), False, THINKING_TEMPLATE,
         (-1, False)),  # (held from the first token)
        ("<assistant><think>\n", {}, SamplingParams(), False, "{{ messages }}", (-1, False)),  # (never thinks)
    ],
)  # fmt: skip
def test_a_thinking_budget_goes_where_the_answer_may_think(prompt, body, params, held, template, expected):
    tok = FakeTokenizer()
    out = plan({**body, "thinking_token_budget": 5}, template, tok, tok.encode(prompt), params, held)[2]
    assert (out.think_budget, out.think_inside) == expected
    if out.think_budget >= 0:
        assert (out.think_open, out.think_close) == (tuple(tok.encode(OPEN)), tuple(tok.encode(CLOSE)))
    assert plan(body, template, tok, tok.encode(prompt), params, held)[2].think_budget == -1


def test_a_bad_thinking_budget_is_refused_by_name_and_completions_take_none():
    from spmd_serve.frontend.common.parsing import Limits
    from spmd_serve.frontend.openai.protocol import parse_openai

    tok = FakeTokenizer()
    tok.chat_template_source = THINKING_TEMPLATE
    limits = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    assert parse_openai("chat", {**chat, "thinking_token_budget": 0}, tok, limits, ("m",)).params.think_budget == 0
    for bad in (-1, "5", True, 2**31, 1.5):
        with pytest.raises(OpenAIError) as e:
            parse_openai("chat", {**chat, "thinking_token_budget": bad}, tok, limits, ("m",))
        assert (e.value.status, e.value.param) == (400, "thinking_token_budget")
    with pytest.raises(OpenAIError) as e:
        parse_openai("completion", {"model": "m", "prompt": "a", "thinking_token_budget": 5}, tok, limits, ("m",))
    assert (e.value.status, e.value.param) == (400, "thinking_token_budget")
