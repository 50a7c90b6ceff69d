"""Structural tags for the tests (tests/unit/test_structural_tag.py), both forms, and texts drawn
from them: `derive` writes a text a format may read (values valid to their schemas or not, free text
of pieces), `texts` those and texts of random pieces of the spec's own strings."""

from __future__ import annotations

import json
import random

from tests.support.structural_oracle import later_form

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 5}},
    "required": ["city"],
    "additionalProperties": False,
}
TZ = {
    "type": "object",
    "properties": {"tz": {"enum": ["utc", "cet"]}, "n": {"type": "integer"}},
    "additionalProperties": False,
}
NAMES = {"type": "array", "items": {"type": "string"}, "maxItems": 2}
ANY = {"type": "object"}
ANY3 = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "array"}}}
SPECS = {
    "functions": {"structures": [{"begin": "<f=weather>", "schema": CITY, "end": "</f>"},
                                 {"begin": "<f=time>", "schema": TZ, "end": "</f>"}], "triggers": ["<f="]},
    "hermes": {"structures": [{"begin": "<tool_call>", "schema": ANY, "end": "</tool_call>"}],
               "triggers": ["<tool_call>"]},
    # one trigger, two begins read together until they part; the same begin with two schemas; no end
    "shared": {"structures": [{"begin": "a=", "schema": CITY, "end": ";"}, {"begin": "a=", "schema": NAMES, "end": ";"},
                              {"begin": "ab", "schema": TZ, "end": ""}], "triggers": ["a"]},
    # a trigger that begins with a space, after a value whose structure has no end
    "spaced": {"structures": [{"begin": " <x", "schema": NAMES, "end": ""}, {"begin": "[[", "schema": TZ, "end": "]]"}],
               "triggers": [" <x", "[["]},
    # the later form: reasoning, then free text with calls (one tag with two ends)
    "think": {"format": {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<t>", "content": {"type": "any_text"}, "end": "</t>"},
        {"type": "triggered_tags", "triggers": ["<f="], "tags": [
            {"begin": "<f=a>", "content": {"type": "json_schema", "json_schema": CITY}, "end": "</f>"},
            {"begin": "<f=b>", "content": {"type": "json_schema", "json_schema": TZ}, "end": ["</f>", "</b>"]}]}]}},
    # one forced block of calls, separated, then nothing
    "calls": {"format": {"type": "triggered_tags", "triggers": ["<c>"], "at_least_one": True, "stop_after_first": True,
                         "tags": [{"begin": "<c>", "end": "</c>", "content": {
                             "type": "tags_with_separator", "separator": ",", "at_least_one": True, "tags": [
                                 {"begin": "(", "content": {"type": "json_schema", "json_schema": NAMES},
                                  "end": ")"}]}}]}},
    # a choice of a literal, a regex then a literal, or a GBNF grammar; then text without "bad"
    "mixed": {"format": {"type": "sequence", "elements": [
        {"type": "or", "elements": [{"type": "const_string", "value": "yes"},
                                    {"type": "sequence", "elements": [{"type": "regex", "pattern": "[0-9]{1,3}"},
                                                                      {"type": "const_string", "value": "!"}]},
                                    {"type": "grammar", "grammar": 'root ::= "(" root ")" | "x"'}]},
        {"type": "any_text", "excludes": ["bad"]}]}},
    # at least one tag, separated, nothing else
    "list": {"format": {"type": "tags_with_separator", "separator": ", ", "at_least_one": True, "tags": [
        {"begin": "<", "content": {"type": "regex", "pattern": "[a-z]{1,4}"}, "end": ">"}]}},
    # triggered tags inside a tag: its text ends at the tag's first end; "STOP" never written
    "nested": {"format": {"type": "tag", "begin": "", "end": ["</done>", "!!"], "content": {
        "type": "triggered_tags", "triggers": ["<f="], "excludes": ["STOP"], "tags": [
            {"begin": "<f=a>", "content": {"type": "json_schema", "json_schema": CITY}, "end": "</f>"}]}}},
    # tags of free text among free text; and inside a tag, whose end must still come after them
    "text_tags": {"format": {"type": "sequence", "elements": [
        {"type": "triggered_tags", "triggers": ["<a>"], "tags": [{"begin": "<a>", "content": {"type": "any_text"},
                                                                    "end": "</a>"}]},
        {"type": "tag", "begin": "<t>", "end": "</t>", "content": {"type": "triggered_tags", "triggers": ["<u"],
                                                                    "tags": [
            {"begin": "<u>", "content": {"type": "any_text"}, "end": "</u>"}]}}]}},
    # text within a tag's sequence may not write the tag's end; nor after a stop_after_first tag
    "fenced": {"format": {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<a>", "end": "</a>", "content": {"type": "sequence", "elements": [
            {"type": "any_text"}, {"type": "const_string", "value": "!"}]}},
        {"type": "tag", "begin": "<t>", "end": "</t>", "content": {
            "type": "triggered_tags", "triggers": ["<u"], "stop_after_first": True, "tags": [
                {"begin": "<u>", "content": {"type": "any_text"}, "end": "</u>"}]}}]}},
}  # fmt: skip
VALUES = [{"city": "Oslo"}, {"city": "Kyoto!"}, {"tz": "utc", "n": 3}, {"n": -1}, {"tz": "gmt"}, {}, ["a", "b"],
          ["a", "b", "c"], [], {"x": [1, {"y": None}]}, [1], "s"]  # fmt: skip


def parts(f) -> tuple[list[str], list[tuple[str, str]]]:
    """Every string of a format (begins, ends, triggers, literals, ...) and each tag's (begin, end)."""
    strings: list[str] = []
    tags: list[tuple[str, str]] = []
    items = f if isinstance(f, list) else list(f.values()) if isinstance(f, dict) else []
    if isinstance(f, dict) and "begin" in f:
        tags.append((f["begin"], f["end"] if isinstance(f["end"], str) else f["end"][-1]))
    for key in ("begin", "end", "value", "separator", "triggers", "excludes"):
        value = f.get(key) if isinstance(f, dict) else None
        strings += [value] if isinstance(value, str) else value if isinstance(value, list) else []
    for item in items:
        more, inner = parts(item)
        strings, tags = strings + more, tags + inner
    return strings, tags


def derive(f: dict, rng: random.Random, parts: list[str]) -> str:
    """A text the format may read, mostly: values drawn valid or not, text of pieces (an excluded
    string or a trigger among them at times)."""
    kind = f.get("type", "tag")
    if kind == "const_string":
        return f["value"]
    if kind == "json_schema":
        return json.dumps(rng.choice(VALUES), separators=(",", ":") if rng.random() < 0.7 else None)
    if kind in ("regex", "grammar"):
        return rng.choice(
            ["7", "12", "345", "1234", "a", "abc", "abcde"] if kind == "regex" else ["x", "(x)", "((x))", "(x", "y"]
        )
    if kind in ("sequence", "or"):
        items = f["elements"] if kind == "sequence" else [rng.choice(f["elements"])]
        return "".join(derive(e, rng, parts) for e in items)
    if kind == "any_text":
        return "".join(rng.choice(parts) for _ in range(rng.randrange(3)))
    if kind == "tag":
        end = f["end"] if isinstance(f["end"], str) else rng.choice(f["end"])
        return f["begin"] + rng.choice(["", "", "\n"]) * (f["content"].get("type") == "json_schema") + derive(
            f["content"], rng, parts) + end  # fmt: skip
    count = rng.randint(1 if f.get("at_least_one") else 0, 1 if f.get("stop_after_first") else 3)
    if kind == "tags_with_separator":
        return f["separator"].join(derive(rng.choice(f["tags"]), rng, parts) for _ in range(count))
    text = "" if f.get("at_least_one") else rng.choice(parts)
    for _ in range(count):
        text += derive(rng.choice(f["tags"]), rng, parts) + ("" if f.get("stop_after_first") else rng.choice(parts))
    return text


def texts(spec: dict, rng: random.Random) -> list[bytes]:
    """Derived texts and texts of pieces (the format's strings and their parts, letters, values)."""
    strings, _ = parts(later_form(spec))
    bits = [" ", "\n", "x", "<", "a", "b", "=", ";", "]", "{}", "(x)", "12", *strings, *(t[:-1] for t in strings)]
    plain = [p for p in bits if not any(t in p for t in strings)] or [" "]
    derived = [derive(later_form(spec), rng, plain if rng.random() < 0.8 else bits) for _ in range(600)]
    pieces = ["".join(rng.choice(bits) for _ in range(rng.randrange(1, 8))) for _ in range(300)]
    return [t.encode() for t in ["", *derived, *pieces]]
