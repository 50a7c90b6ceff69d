"""What every protocol's parser shares, as pure data: the refusal (`ProtocolError`), the length
limits a request is checked against (`Limits`), a request body's bytes -> JSON (`decode_json`,
`decode_body`), the JSON value tests the parsers build on (`is_int`, `finite_number`) and the
vocabulary check of token ids a request names (`check_in_vocab`).

No tornado and no engine here.  A refusal's message goes straight back to the user, so it names
the field and, for limits, the limit.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any


class ProtocolError(Exception):
    """A request the server refuses; `status` is the HTTP status of the error body."""

    def __init__(self, status: int, msg: str, req_id: str = "") -> None:
        super().__init__(msg)
        self.status = status
        self.msg = msg
        self.req_id = req_id


@dataclass(frozen=True)
class Limits:
    """Length limits a request is checked against (MAX_SEQ_LEN, MAX_DEC_LEN, the model's own)."""

    max_seq_len: int
    max_dec_len: int
    model_max_len: int


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def reject_json_constant(name: str) -> Any:
    """`parse_constant` for json.loads: JSON has no NaN/Infinity; Python's json accepts them, and
    a NaN temperature would slip through every range check, so treat them as malformed JSON."""
    raise ValueError(f"{name} is not valid JSON")


def decode_json(raw: bytes, what: str = "request body") -> Any:
    """Bytes of a JSON document (an HTTP body, gRPC's IN tensor) -> its value; anything that is
    not valid JSON is a 400 naming `what`, never a 500."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=reject_json_constant)
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise ProtocolError(400, f"{what} is not valid JSON: {e}") from None
    except RecursionError:  # e.g. [[[[...]]]] thousands deep
        raise ProtocolError(400, f"{what} is not valid JSON: nested too deeply") from None
    # "\ud800" without its pair decodes to a str that cannot be encoded again: it would fail
    # later in the tokenizer or while writing a response that echoes it.  Only an escape can
    # produce one (the raw bytes decoded as UTF-8), so the full check runs only when one is seen.
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError(
                400, f"{what} is not valid JSON: it contains an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF)"
            ) from None
        except RecursionError:  # nested below json.loads' limit but not json.dumps'
            raise ProtocolError(400, f"{what} is not valid JSON: nested too deeply") from None
    return value


def decode_body(raw: bytes) -> dict[str, Any]:
    """Bytes of a request body -> JSON object; anything else is a 400, never a 500."""
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise ProtocolError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def is_int(v: Any) -> bool:
    """A JSON integer: True is an int in Python, not here."""
    return isinstance(v, int) and not isinstance(v, bool)


def finite_number(v: Any) -> float | None:
    """A JSON number as a finite float; None for anything else, including ints beyond float's
    range (float() would raise) and the inf that json gives for 1e400."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def check_in_vocab(name: str, ids: list[int], vocab_size: int | None, req_id: str = "") -> None:
    """An id past the embedding table would fail inside every rank's graph, and one the sampler
    can never produce (an eos id) is a mistake too: 400 naming the field and the vocabulary."""
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise ProtocolError(400, f"{name} contains {max(ids)}, outside the vocabulary (size {vocab_size})", req_id)


def show(value: Any, limit: int = 80) -> str:
    """A request value as an error message quotes it: its JSON, cut to `limit` characters (a
    value nested nearly as deep as json.loads allows could overflow the stack when written again)."""
    try:
        return json.dumps(value, ensure_ascii=False)[:limit]
    except (RecursionError, ValueError, TypeError):
        return f"a {type(value).__name__}"
