"""vLLM's structural tag read from an OpenAI body (engine/structural_tag.py): `response_format`
{"type": "structural_tag", "structures": [...], "triggers": [...]}, the `structural_tag` extra or
`structured_outputs.structural_tag` (JSON text, or the object itself).  At most one of them, and
not with another structured output; a refusal is a FieldError naming the field."""

from __future__ import annotations

import json
from typing import Any

from spmd_serve.engine import structural_tag as tags
from spmd_serve.frontend.openai.fields import FieldError, given_once
from spmd_serve.frontend.openai.token_params import Slow, check_grammar
from spmd_serve.sampling_params import MAX_SCHEMA_CHARS


def structural_tag(body: dict[str, Any], other: str, slow: Slow | None = None) -> str:
    """The structural tag as compact JSON text ("" for none).  `other`: the structured output already
    given (a guided choice, a JSON schema, ...), if any.  Its grammar is compiled to check it now,
    or by the check put in `slow` where that is given."""
    fmt, outputs = body.get("response_format"), body.get("structured_outputs")
    given = given_once([
        ("response_format", fmt if isinstance(fmt, dict) and fmt.get("type") == "structural_tag" else None),
        ("structural_tag", body.get("structural_tag")),
        ("structured_outputs.structural_tag", outputs.get("structural_tag") if isinstance(outputs, dict) else None),
    ], other)  # fmt: skip
    if given is None:
        return ""
    name, spec = given
    if isinstance(spec, str):
        if len(spec) > MAX_SCHEMA_CHARS:
            raise FieldError(f"{name} is more than {MAX_SCHEMA_CHARS} characters of JSON", name)
        try:
            spec = json.loads(spec)
        except (ValueError, RecursionError) as e:
            raise FieldError(f"{name} is not JSON text this server reads: {e}", name) from None
    try:
        text = tags.canonical(spec, name)
    except (ValueError, RecursionError) as e:
        raise FieldError(str(e) or type(e).__name__, name) from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise FieldError(f"{name} is more than {MAX_SCHEMA_CHARS} characters of JSON", name)
    check_grammar(lambda: tags.answer_grammar(text, name), "", name, slow)
    return text
