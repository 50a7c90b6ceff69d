"""The JSON schema an OpenAI body holds its answer to (engine/json_schema.py), from whichever field
names it, and the whitespace between its lexemes (engine/json_whitespace.py): vLLM's
`structured_outputs.disable_any_whitespace` ("json output will always be compact": none),
`structured_outputs.whitespace_pattern` or the older `guided_whitespace_pattern` (a regular
expression every run of it matches whole, as outlines reads it).  A refusal is a FieldError naming
the field."""

from __future__ import annotations

import json
from typing import Any

from spmd_serve.engine import json_schema as json_schemas
from spmd_serve.engine.json_whitespace import pattern_dfa
from spmd_serve.frontend.common.parsing import show
from spmd_serve.frontend.openai.fields import FieldError, given_once
from spmd_serve.frontend.openai.token_params import Slow, check_grammar
from spmd_serve.sampling_params import JSON_OBJECT, MAX_SCHEMA_CHARS, MAX_WHITESPACE_CHARS


def whitespace(body: dict[str, Any]) -> tuple[str | None, str]:
    """(the pattern every run of whitespace in the JSON answer matches, "" for none, or None for the
    default rule; the field that gave it, "" for none)."""
    outputs = body.get("structured_outputs")
    outputs = outputs if isinstance(outputs, dict) else {}
    flag = outputs.get("disable_any_whitespace")
    if not (flag is None or isinstance(flag, bool)):
        name = "structured_outputs.disable_any_whitespace"
        raise FieldError(f"{name} must be a boolean, got {show(flag)}", name)
    given = given_once(
        [("structured_outputs.whitespace_pattern", outputs.get("whitespace_pattern")),
         ("guided_whitespace_pattern", body.get("guided_whitespace_pattern")),
         ("structured_outputs.disable_any_whitespace", "" if flag else None)],
        "",
    )  # fmt: skip
    if given is None:
        return None, ""
    name, pattern = given
    if not isinstance(pattern, str) or len(pattern) > MAX_WHITESPACE_CHARS:
        raise FieldError(f"{name} must be a regular expression of at most {MAX_WHITESPACE_CHARS} characters", name)
    try:
        pattern_dfa(pattern, name)
    except ValueError as e:
        raise FieldError(str(e), name) from None
    return pattern, name


def json_schema(body: dict[str, Any], ends_on_eos: bool, tool_schema: str = "", slow: Slow | None = None) -> str:
    """The JSON schema the answer is held to, as JSON text ("" for none): OpenAI's `response_format`
    (json_object: any object; json_schema: its `schema`), vLLM's `guided_json` or its later
    `structured_outputs` ("json", "json_object").  At most one may be given, not with a guided choice,
    ignore_eos or min_tokens (an EOS ends the answer); a schema this server cannot hold an answer
    to is refused naming what (engine/json_schema.py).  `tool_schema`: a named tool_choice's
    function's parameters (frontend/openai/tools.py), held to the same way.  The schema's grammar is
    compiled to check it now, or later by the check put in `slow` where that is given (with the
    whitespace `whitespace` reads)."""
    fmt, outputs = body.get("response_format"), body.get("structured_outputs")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is not None and kind not in ("text", "json_object", "json_schema", "structural_tag"):
        raise FieldError(
            "response_format must be an object with type 'text', 'json_object', 'json_schema' or 'structural_tag', "
            f"got {show(fmt)}",
            "response_format",
        )
    outputs = outputs if isinstance(outputs, dict) else {}
    given: dict[str, Any] = {"tool_choice": tool_schema} if tool_schema else {}
    if kind == "json_object":
        given["response_format"] = JSON_OBJECT
    elif kind == "json_schema":
        spec = fmt.get("json_schema")  # type: ignore[union-attr]
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise FieldError("response_format.json_schema must be an object with a name", "response_format")
        given["response_format"] = spec.get("schema", JSON_OBJECT)
    for name, value in (("guided_json", body.get("guided_json")), ("structured_outputs.json", outputs.get("json"))):
        if value is not None:
            given[name] = value
    flag = outputs.get("json_object")
    if not (flag is None or isinstance(flag, bool)):
        raise FieldError(f"structured_outputs.json_object must be a boolean, got {show(flag)}", "structured_outputs")
    if flag:
        given["structured_outputs.json_object"] = JSON_OBJECT
    spaces, spaces_field = whitespace(body)
    if not given:
        if spaces_field:
            raise FieldError(
                f"{spaces_field} applies to a JSON answer (response_format json_schema or json_object, "
                "guided_json, structured_outputs.json or json_object, a tool_choice), and this request holds none",
                spaces_field,
            )
        return ""
    name, schema = next(iter(given.items()))
    if len(given) > 1 or body.get("guided_choice") is not None or outputs.get("choice") is not None:
        raise FieldError(f"{name} and {(set(given) - {name} or {'a guided choice'}).pop()} cannot both be given", name)
    if not ends_on_eos:
        raise FieldError(f"{name} ends the answer with an EOS: not with ignore_eos or min_tokens", name)
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError) as e:
        raise FieldError(f"{name}: {str(e) or type(e).__name__}", name) from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise FieldError(f"{name} is more than {MAX_SCHEMA_CHARS} characters of JSON", name)
    # (the grammar is kept: the engine's is made from the same text where it shares this process)
    prefix = "tool_choice (the tools' parameters as one JSON schema): " if name == "tool_choice" else f"{name}: "
    check_grammar(lambda: json_schemas.grammar(text, spaces), prefix, name, slow)
    return text
