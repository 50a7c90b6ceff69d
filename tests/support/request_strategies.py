"""Hypothesis strategies for request bodies of every protocol (native — also what gRPC's IN tensor
carries — and OpenAI completions and chat), used by the campaign in tests/mpi/test_request_fuzz_mpi.py.

Every field a parser knows has a `Field`: values that make sense (`good`, so bodies pass validation
and reach the engine) and values aimed at its bounds (`bad`: extreme integers and floats, NaN and
infinities, unicode, wrong types, nesting).  `body_varying(name)` is a sensible body whose field
`name` is drawn from both (twice as often bad); `mixed_body` draws every field at random, with
unknown keys now and then; `encoded` writes a body as the bytes sent, or bytes that are no JSON
object at all.  FIELDS lists every field per protocol, checked against the parsers' own tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from spmd_serve.frontend.common.vllm_extras import NOT_BUILT, OPENAI_EXTRAS
from spmd_serve.frontend.openai.fields import HONOURED, NEUTRAL

VOCAB = 1024  # the demo model's (spmd_serve/export/demo/checkpoint.py, preset "tiny")

INTS = [2**63 - 1, 2**63, -(2**63) - 1, 2**64, 2**31 - 1, 2**31, -(2**31), 10**30, -1, 0, 1, VOCAB, VOCAB - 1]
FLOATS = [1e308, -1e308, 5e-324, 3.5e38, 3.4028235e38, -0.0, 1e-45, float("nan"), float("inf"), float("-inf")]
OTHERS = ["", "0", "1.5", "\u0000", "\u202e\ud7ff\ue000🙂", True, False, None, [], {}, [None], {"": None}]
LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), st.sampled_from(OTHERS))
NESTED = st.recursive(
    LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
# junk of any kind: what a field of another type, range or shape gets
JUNK = st.one_of(st.sampled_from(INTS + FLOATS + OTHERS), st.integers(), st.floats(), st.text(max_size=20), NESTED)
TEXT = st.text(max_size=40)  # any unicode (no lone surrogates: json.dumps would escape them as valid pairs)
TOKEN = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([0, 1, 2, VOCAB - 1]))


@dataclass(frozen=True)
class Field:
    good: st.SearchStrategy[Any]
    bad: st.SearchStrategy[Any] = JUNK


def integer(lo: int, hi: int) -> Field:
    return Field(st.integers(lo, hi), st.one_of(st.sampled_from(INTS), st.integers(), JUNK))


def number(lo: float, hi: float) -> Field:
    return Field(st.floats(lo, hi), st.one_of(st.sampled_from(FLOATS + INTS), st.floats(), JUNK))


def ids(min_size: int, max_size: int) -> Field:
    """A list of token ids; bad lists hold ids beyond every bound (the eos 2**64 that once killed the server)."""
    beyond = st.lists(st.one_of(TOKEN, st.sampled_from(INTS)), min_size=1, max_size=4)
    return Field(st.lists(TOKEN, min_size=min_size, max_size=max_size), st.one_of(beyond, beyond, JUNK))


def strings() -> Field:
    return Field(st.one_of(TEXT, st.lists(TEXT, max_size=3)), st.one_of(st.lists(JUNK, min_size=1, max_size=3), JUNK))


BOOL = Field(st.booleans())
PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["user", "assistant", "system"]), TEXT),
        "content": st.one_of(TEXT, st.lists(PART, max_size=2)),
    }
)
MESSAGES = Field(
    st.lists(MESSAGE, min_size=1, max_size=4),
    st.one_of(st.lists(st.one_of(MESSAGE, st.dictionaries(st.text(max_size=8), JUNK, max_size=3), JUNK)), JUNK),
)

NATIVE = {
    "req_id": Field(st.one_of(st.uuids().map(str), st.integers(0, 2**40))),
    "text": Field(TEXT),
    "messages": MESSAGES,
    "input_ids": ids(1, 20),
    "system": Field(TEXT),
    **{k: integer(1, 8) for k in ("max_dec_len", "seq_len", "max_tokens", "max_completion_tokens")},
    **{k: integer(1, 4) for k in ("min_dec_len", "min_tokens")},
    **{k: number(0, 1) for k in ("topp", "top_p")},
    "temperature": number(0, 2),
    **{k: number(0.5, 2) for k in ("penalty_score", "repetition_penalty")},
    **{k: number(-2, 2) for k in ("frequency_score", "presence_score", "frequency_penalty", "presence_penalty")},
    **{k: integer(0, 2**63 - 1) for k in ("seed", "infer_seed")},
    "eos_token_ids": ids(0, 3),
    **{k: strings() for k in ("stop_sequences", "stop")},
    "timeout": number(0.001, 60),
    **{k: BOOL for k in ("stream", "return_usage", "return_all_tokens", "benchmark")},
    # vLLM's extras this server does not build: their neutral values, or anything else (refused)
    **{k: Field(st.sampled_from([*v, None])) for k, v in {**NOT_BUILT, **OPENAI_EXTRAS}.items()},
}
NATIVE_PROMPTS = ("text", "messages", "input_ids")
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
SCHEMAS = st.sampled_from([  # JSON schemas engine/json_schema.py builds
    {"type": "object"},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"]}}, "required": ["a"]},
    {"type": "object",
     "properties": {"x": {"enum": ["u", "v", 1]}, "y": {"type": "array", "items": {"type": "boolean"}}}},
    {"type": "object", "properties": {"d": {"type": "string", "format": "date"}, "p": {"type": "string",
     "pattern": "[a-z]{1,3}-[0-9]"}}},
])  # fmt: skip
REGEXES = st.sampled_from([r"(yes|no)", r"[0-9]{1,4}", r"\w+@\w+\.com", r".{0,8}"])  # patterns built
GRAMMARS = st.sampled_from(['root ::= "(" root ")" | [a-z]{1,3}', 'root ::= ("- " [a-z]+ "\\n"){1,3}'])  # GBNF built
TAGS = st.sampled_from([  # structural tags built
    {"structures": [{"begin": "<f=a>", "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<f="]},
    {"structures": [{"begin": ".", "schema": {"type": "array", "items": {"type": "integer"}}, "end": ""}],
     "triggers": ["."]},
    {"format": {"type": "sequence", "elements": [{"type": "const_string", "value": "A: "}, {"type": "any_text"}]}},
])  # fmt: skip
BAD_TAGS = st.sampled_from([
    {"structures": [{"begin": "<a>", "schema": {"type": "string"}}], "triggers": ["<"]},
    {"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<b"]}, {"format": {"type": "token"}},
])  # fmt: skip

_OPENAI_COMMON = {
    "model": Field(st.sampled_from(["default", "default", "default", "no-such-model"])),
    **{k: integer(1, 8) for k in ("max_tokens", "max_completion_tokens")},
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "top_k": integer(-1, 50),
    "min_p": number(0, 1),
    "n": integer(1, 3),
    "best_of": integer(1, 3),
    "stop": strings(),
    "stream": BOOL,
    "stream_options": Field(
        st.fixed_dictionaries({"include_usage": st.booleans()}, optional={"continuous_usage_stats": st.booleans()})
    ),
    **{k: number(-2, 2) for k in ("presence_penalty", "frequency_penalty")},
    "repetition_penalty": number(0.5, 2),
    "seed": integer(-(2**63), 2**63 - 1),
    "min_tokens": integer(0, 4),
    "ignore_eos": BOOL,
    "user": Field(TEXT),
    "stop_token_ids": ids(0, 3),
    "allowed_token_ids": ids(1, 4),
    "include_stop_str_in_output": BOOL,
    "skip_special_tokens": BOOL,
    "spaces_between_special_tokens": BOOL,
    "prompt_logprobs": integer(0, 20),
    "structured_outputs": Field(
        st.one_of(
            st.fixed_dictionaries({"choice": st.lists(TEXT, min_size=1, max_size=3)}),
            st.fixed_dictionaries({"json_object": st.booleans()}),
            st.fixed_dictionaries({"json": SCHEMAS}),
            st.fixed_dictionaries({"json": SCHEMAS, "disable_any_whitespace": st.booleans()}),
            st.fixed_dictionaries({"json": SCHEMAS, "whitespace_pattern": st.sampled_from(["[ ]?", "", "\n?", " *"])}),
            st.fixed_dictionaries({"regex": REGEXES}),
            st.fixed_dictionaries({"grammar": GRAMMARS}),
            st.fixed_dictionaries({"structural_tag": TAGS.map(json.dumps)}),
        ),
        st.one_of(
            TEXT,
            JUNK,
            st.fixed_dictionaries({"json_object": JUNK}),
            st.fixed_dictionaries({"json": JUNK}),
            st.fixed_dictionaries(
                {
                    "json": SCHEMAS,
                    "disable_any_whitespace": JUNK.filter(lambda v: v is not None and not isinstance(v, bool)),
                }
            ),
        ),
    ),
    "response_format": Field(
        st.one_of(
            st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
            st.fixed_dictionaries(
                {
                    "type": st.just("json_schema"),
                    "json_schema": st.fixed_dictionaries({"name": st.just("x"), "schema": SCHEMAS}),
                }
            ),
            TAGS.map(lambda t: {"type": "structural_tag", **t}),
        ),
        st.one_of(
            TEXT,
            JUNK,
            st.just({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}}),
            BAD_TAGS.map(lambda t: {"type": "structural_tag", **t}),
        ),
    ),
    "guided_json": Field(
        SCHEMAS | SCHEMAS.map(json.dumps), st.one_of(TEXT, JUNK, st.just({"type": "object", "multipleOf": 2}))
    ),
    "guided_whitespace_pattern": Field(
        st.sampled_from(["[ ]?", "", " *", "\n?"]), st.one_of(JUNK, st.sampled_from(["\\s*", "[a ]", "(", " {40}"]))
    ),
    "guided_regex": Field(REGEXES, st.one_of(JUNK, st.sampled_from(["(a)\\1", "[", "a(?=b)", "\x01"]))),
    "guided_grammar": Field(GRAMMARS, st.one_of(JUNK, st.sampled_from(["root ::= x", 'root ::= root "a"', "a ::= ("]))),
    "structural_tag": Field(TAGS | TAGS.map(json.dumps), st.one_of(TEXT, JUNK, BAD_TAGS)),
    "guided_choice": Field(st.lists(TEXT, min_size=1, max_size=3), st.one_of(TEXT, st.lists(JUNK, max_size=3), JUNK)),
    "bad_words": Field(st.lists(TEXT, max_size=3), st.one_of(TEXT, st.lists(JUNK, min_size=1, max_size=3), JUNK)),
    "truncate_prompt_tokens": integer(1, 20),
    "return_tokens_as_token_ids": BOOL,
    "return_token_ids": BOOL,
    "request_id": Field(TEXT, st.one_of(JUNK, st.just("x" * 257))),
    "cache_salt": Field(st.text(min_size=1, max_size=40), st.one_of(JUNK, st.just(""), st.just("s" * 1025))),
    # token id (a decimal string) -> bias; bad maps: ids past every bound, "07"-style repeats, junk values
    "logit_bias": Field(
        st.dictionaries(TOKEN.map(str), st.floats(-100, 100), max_size=4),
        st.one_of(
            st.dictionaries(
                st.one_of(st.sampled_from(INTS).map(str), st.text(max_size=6)), JUNK, min_size=1, max_size=3
            ),
            st.just({"7": 1, "07": 2}),
            JUNK,
        ),
    ),
}
OPENAI = {
    "completion": {
        **_OPENAI_COMMON,
        "prompt": Field(st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=2), ids(1, 20).good)),
        "echo": BOOL,
        "logprobs": integer(0, 5),
        "add_special_tokens": BOOL,
    },
    "chat": {
        **_OPENAI_COMMON,
        "messages": MESSAGES,
        "logprobs": BOOL,
        "top_logprobs": integer(0, 5),
        "add_generation_prompt": BOOL,
        "continue_final_message": BOOL,
        "echo": BOOL,
        "chat_template_kwargs": Field(st.dictionaries(st.sampled_from(["enable_thinking", "x", "tools"]), LEAF)),
        "tools": Field(
            st.sampled_from([[], [TOOL]]),
            st.one_of(JUNK, st.lists(JUNK, min_size=1, max_size=2), st.just([{"type": "function", "function": {}}])),
        ),
        "parallel_tool_calls": BOOL,
        "include_reasoning": BOOL,
        "separate_reasoning": BOOL,
        "thinking_token_budget": integer(0, 16),
        # (the demo's template reads no switch: a good value is a 400 naming it too, never a 500)
        "reasoning_effort": Field(st.sampled_from(["none", "low", "high"]), st.one_of(JUNK, st.just("extreme"))),
        "tool_choice": Field(
            st.sampled_from(["none", "required", {"type": "function", "function": {"name": "get_weather"}}]),
            st.one_of(st.sampled_from(["auto", {"type": "function", "function": {"name": "x"}}]), JUNK),
        ),
    },
}
for _kind, _fields in OPENAI.items():  # the known unsupported ones: their neutral values, or anything else
    for _name, _neutral in NEUTRAL[_kind].items():
        _fields[_name] = Field(st.sampled_from([*_neutral, None]))
OPENAI_REQUIRED = {"completion": ("model", "prompt", "max_tokens"), "chat": ("model", "messages", "max_tokens")}
assert all(set(OPENAI[k]) == HONOURED[k] | set(NEUTRAL[k]) for k in OPENAI), "a field has no strategy"


@st.composite
def body_varying(draw: st.DrawFn, protocol: str, name: str) -> dict[str, Any]:
    """A sensible body of `protocol` ("native" | "completion" | "chat") whose field `name` takes
    a good value one time in three and a bad one otherwise."""
    fields = NATIVE if protocol == "native" else OPENAI[protocol]
    if protocol == "native":
        prompt = name if name in NATIVE_PROMPTS else draw(st.sampled_from(NATIVE_PROMPTS))
        required: tuple[str, ...] = (prompt, "max_dec_len")
    else:
        required = OPENAI_REQUIRED[protocol]
    body = {n: draw(fields[n].good) for n in required}
    f = fields[name]
    body[name] = draw(st.one_of(f.good, f.bad, f.bad))
    return body


@st.composite
def mixed_body(draw: st.DrawFn, protocol: str) -> dict[str, Any]:
    """Any fields of `protocol`, each good or bad, and now and then a key nobody defined."""
    fields = NATIVE if protocol == "native" else OPENAI[protocol]
    names = draw(st.lists(st.sampled_from(sorted(fields)), max_size=8, unique=True))
    body = {n: draw(st.one_of(fields[n].good, fields[n].good, fields[n].bad)) for n in names}
    if draw(st.integers(0, 4)) == 0:
        body[draw(st.text(min_size=1, max_size=10))] = draw(JUNK)
    return body


@st.composite
def encoded(draw: st.DrawFn, bodies: st.SearchStrategy[Any]) -> bytes:
    """A body as the bytes sent (NaN and infinities written as Python's json does, which JSON
    forbids), or one time in five bytes that are no JSON object at all."""
    kind = draw(st.integers(0, 14))
    if kind == 0:
        return draw(st.binary(max_size=40))
    if kind == 1:
        return json.dumps(draw(JUNK)).encode()
    if kind == 2:
        depth = draw(st.integers(1, 5000))
        return b"[" * depth + b"]" * depth
    return json.dumps(draw(bodies), ensure_ascii=False).encode()
