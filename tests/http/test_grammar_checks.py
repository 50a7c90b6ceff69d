"""A structured output's grammar is compiled off the HTTP worker's IO loop (a schema of dozens of
properties takes ~0.1 s, which every stream the loop serves would wait), and so is the one reading of
every token's bytes the engine's masks need; what the compile refuses is still a 400 naming the
field, before anything is sent to the engine."""

import threading

import pytest
import requests

from spmd_serve.engine import gbnf_grammar, json_masks, json_patterns, json_schema, structural_tag
from spmd_serve.frontend.openai import handlers


@pytest.fixture
def threads(monkeypatch):
    """{"parse": the threads that parsed a body (the IO loop's), "compile": those that compiled,
    "vocabulary": those that read the tokenizer's every token (once)}."""
    seen: dict[str, set[str]] = {"parse": set(), "compile": set(), "vocabulary": set()}

    def recorded(kind, fn):
        def call(*args, **kw):
            seen[kind].add(threading.current_thread().name)
            return fn(*args, **kw)

        return call

    monkeypatch.setattr(handlers, "parse_openai", recorded("parse", handlers.parse_openai))
    monkeypatch.setattr(json_schema, "grammar", recorded("compile", json_schema.grammar))
    monkeypatch.setattr(json_patterns, "answer_grammar", recorded("compile", json_patterns.answer_grammar))
    monkeypatch.setattr(gbnf_grammar, "answer_grammar", recorded("compile", gbnf_grammar.answer_grammar))
    monkeypatch.setattr(structural_tag, "answer_grammar", recorded("compile", structural_tag.answer_grammar))
    monkeypatch.setattr(json_masks, "read_vocabulary", recorded("vocabulary", json_masks.read_vocabulary))
    monkeypatch.setattr(json_masks, "_VOCABULARIES", {})
    return seen


def post(srv, **fields) -> requests.Response:
    body = {"model": "default", "prompt": "hi", "max_tokens": 3, **fields}
    return requests.post(
        srv.base + "/v1/completions", json=body, timeout=60
    )  # (a compile beside other work on 2 cores: over 10 s once)


@pytest.mark.parametrize(
    "fields",
    [
        {"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}},
        {"guided_regex": "[a-z]{1,8}"},
        {"guided_grammar": 'root ::= "(" root ")" | [a-z]'},
        {
            "structural_tag": {
                "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": ""}],
                "triggers": ["<a"],
            }
        },
    ],
)
def test_a_grammar_compiles_off_the_io_loop(srv, threads, fields):
    assert post(srv, **fields).status_code == 200
    assert threads["parse"] and threads["compile"] and not threads["parse"] & threads["compile"]
    assert len(threads["vocabulary"]) == 1 and not threads["parse"] & threads["vocabulary"]
    assert post(srv, **fields).status_code == 200 and len(threads["vocabulary"]) == 1  # (read once)


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"guided_json": {"type": "object", "minProperties": 1}}, "guided_json", "minProperties"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "string"}}}},
            "response_format",
            "root must be an object or array",
        ),
        ({"guided_regex": r"(a)\1"}, "guided_regex", "backreference"),
        ({"structured_outputs": {"regex": "a(?=b)"}}, "structured_outputs.regex", "lookaround"),
        ({"guided_grammar": 'root ::= root "a"'}, "guided_grammar", "without one-character brackets"),
        ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar", "'x', which is not defined"),
        (
            {
                "response_format": {
                    "type": "structural_tag",
                    "triggers": ["<"],
                    "structures": [{"begin": "<a>", "schema": {"type": "object", "if": {}}, "end": ""}],
                }
            },
            "response_format",
            "the keyword 'if' is not supported",
        ),
        (
            {"structural_tag": {"format": {"type": "sequence", "elements": [{"type": "regex", "pattern": "(a)\\1"}]}}},
            "structural_tag",
            "structural_tag.format.elements[0].pattern",
        ),
    ],
)
def test_a_grammar_its_compile_refuses_is_a_400_naming_the_field(srv, threads, fields, param, words):
    res = post(srv, **fields)
    err = res.json()["error"]
    assert res.status_code == 400 and err["param"] == param and words in err["message"], err
    assert param in err["message"] and threads["compile"] and not threads["parse"] & threads["compile"]
    assert not srv.engine.added  # nothing reached the engine
