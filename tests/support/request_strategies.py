"""Hypothesis strategies for request bodies of every protocol (native, OpenAI completions and chat,
gRPC's IN tensor): every field the parsers read, each drawn from values that make sense (so many
bodies pass validation and reach the engine) or from junk — extreme integers and floats, NaN and
infinities, unicode, wrong types, nesting, unknown keys — plus bodies that are not JSON objects at
all.  Used by the campaign in tests/mpi/test_request_fuzz_mpi.py.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

VOCAB = 1024  # the demo model's (spmd_serve/export/demo/checkpoint.py, preset "tiny")

EXTREMES = [
    2**63 - 1, 2**63, -(2**63) - 1, 2**64, 2**31 - 1, 2**31, -(2**31), 10**30, -1, 0, 1, VOCAB, VOCAB - 1,
    1e308, -1e308, 5e-324, 3.5e38, -0.0, 1e-45, float("nan"), float("inf"), float("-inf"),
    "", "0", "1.5", "\u0000", "\ud7ff\ue000", True, False, None, [], {}, [None], {"": None},
]  # fmt: skip

JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), st.sampled_from(EXTREMES)
)
NESTED = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
# junk of any kind: what a field of another type, range or shape gets
JUNK = st.one_of(st.sampled_from(EXTREMES), st.integers(), st.floats(), st.text(max_size=20), NESTED)
TEXT = st.text(max_size=40)  # any unicode (no lone surrogates: json.dumps would escape them as valid pairs)
TOKEN = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([0, 1, 2, VOCAB - 1]))
# ids a request names besides its prompt (eos / stop token ids): some beyond every bound
ANY_ID = st.one_of(TOKEN, TOKEN, st.sampled_from([e for e in EXTREMES if type(e) is int]))
SMALL_COUNT = st.integers(0, 10)


def field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: usually a sensible one, sometimes junk."""
    return st.one_of(good, good, good, JUNK)


@st.composite
def body_of(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...]) -> dict:
    """A JSON object: the `required` fields and some of the others.  Half the bodies are sensible
    throughout (so they reach the engine), most others have one junk field, a few are junk all
    over; now and then a key nobody defined is added."""
    names = list(required) + [n for n in fields if n not in required and draw(st.integers(0, 9)) < 2]
    body = {n: draw(fields[n]) for n in names}
    mode = draw(st.integers(0, 9))
    if mode in (5, 6, 7, 8):  # one field junk (or absent)
        name = draw(st.sampled_from(sorted(fields)))
        body[name] = draw(JUNK)
    elif mode == 9:
        body = {n: draw(field(fields[n])) for n in names}
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(min_size=1, max_size=10))] = draw(JUNK)
    return body


PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["user", "assistant", "system"]), TEXT),
        "content": st.one_of(TEXT, st.lists(PART, max_size=2)),
    }
)
MESSAGES = st.lists(MESSAGE, min_size=1, max_size=4)
IDS = st.lists(TOKEN, min_size=1, max_size=20)
PROB = st.floats(0, 1)
TEMPERATURE = st.one_of(st.just(0.0), st.floats(0, 2))
PENALTY = st.floats(-2, 2)

NATIVE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "req_id": st.one_of(st.uuids().map(str), st.integers(0, 2**40)),
    "text": TEXT,
    "messages": MESSAGES,
    "input_ids": IDS,
    "system": TEXT,
    "max_dec_len": st.integers(1, 8),
    "seq_len": st.integers(1, 8),
    "max_tokens": st.integers(1, 8),
    "min_dec_len": st.integers(1, 4),
    "topp": PROB,
    "top_p": PROB,
    "temperature": TEMPERATURE,
    "penalty_score": st.floats(0.5, 2),
    "frequency_score": PENALTY,
    "presence_score": PENALTY,
    "seed": st.integers(0, 2**63 - 1),
    "infer_seed": st.integers(0, 2**63 - 1),
    "eos_token_ids": st.lists(ANY_ID, max_size=3),
    "stop_sequences": st.one_of(TEXT, st.lists(TEXT, max_size=3)),
    "stream": st.booleans(),
    "timeout": st.one_of(st.floats(0.001, 60), st.just(300)),
    "return_usage": st.booleans(),
    "return_all_tokens": st.booleans(),
    "benchmark": st.booleans(),
}

COMMON_OPENAI_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["default", "default", "default", "no-such-model"]),
    "max_tokens": st.integers(1, 8),
    "max_completion_tokens": st.integers(1, 8),
    "temperature": TEMPERATURE,
    "top_p": PROB,
    "top_k": st.integers(-1, 50),
    "n": st.integers(1, 3),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3)),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "presence_penalty": PENALTY,
    "frequency_penalty": PENALTY,
    "repetition_penalty": st.floats(0.5, 2),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "min_tokens": st.integers(0, 4),
    "ignore_eos": st.booleans(),
    "user": TEXT,
    "best_of": st.integers(1, 3),
    "logit_bias": st.dictionaries(TOKEN.map(str), PENALTY, max_size=2),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "min_p": PROB,
    "stop_token_ids": st.lists(ANY_ID, max_size=3),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "spaces_between_special_tokens": st.booleans(),
    "truncate_prompt_tokens": st.integers(1, 20),
}

COMPLETION_FIELDS = {
    **COMMON_OPENAI_FIELDS,
    "prompt": st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=2), IDS, st.lists(IDS, min_size=1, max_size=2)),
    "echo": st.booleans(),
    "logprobs": st.integers(0, 5),
    "suffix": TEXT,
}
CHAT_FIELDS = {
    **COMMON_OPENAI_FIELDS,
    "messages": MESSAGES,
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 5),
    "tools": st.just([]),
}


@st.composite
def native_bodies(draw: st.DrawFn) -> dict:
    prompt = draw(st.sampled_from(["text", "messages", "input_ids"]))
    others = {k: v for k, v in NATIVE_FIELDS.items() if k not in {"text", "messages", "input_ids"} - {prompt}}
    body: dict = draw(body_of(others, (prompt, "max_dec_len")))
    return body


def completion_bodies() -> st.SearchStrategy[dict]:
    return body_of(COMPLETION_FIELDS, ("model", "prompt", "max_tokens"))


def chat_bodies() -> st.SearchStrategy[dict]:
    return body_of(CHAT_FIELDS, ("model", "messages", "max_tokens"))


@st.composite
def encoded(draw: st.DrawFn, bodies: st.SearchStrategy[Any]) -> bytes:
    """A body as the bytes sent (NaN and infinities written as Python's json does, which JSON
    forbids), or one time in ten bytes that are no JSON object at all."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(st.binary(max_size=40))
    if kind == 1:
        return json.dumps(draw(JUNK)).encode()
    if kind == 2:
        depth = draw(st.integers(1, 5000))
        return b"[" * depth + b"]" * depth
    return json.dumps(draw(bodies), ensure_ascii=False).encode()
