"""Reading an OpenAI request body: `get` (a field checked for type and range; JSON null is absent)
and `OpenAIError`, the refusal every OpenAI parser raises, with the error body the handler sends
(`{"error": {"message", "type", "param", "code"}}`, `send_openai_error`).  Shared by openai.protocol,
openai.prompts and every route that answers errors in OpenAI's shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.frontend.common.parsing import ProtocolError, finite_number, is_int, show
from spmd_serve.sampling_params import FLOAT32_MAX, INT64_MAX


class OpenAIError(ProtocolError):
    """A refused OpenAI request; `param` names the offending parameter when there is one."""

    def __init__(self, status: int, msg: str, param: str | None = None) -> None:
        super().__init__(status, msg)
        self.param = param


_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
    409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
    503: "service_unavailable", 504: "timeout",
}  # fmt: skip


def error_body(status: int, msg: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": msg, "type": _TYPES.get(status, "server_error"), "param": param, "code": status}}


# One test per kind, only the one asked for runs: float tests on a huge int would overflow.
_KIND_OK: dict[str, Callable[[Any], bool]] = {
    "int": is_int,
    "bool": lambda x: isinstance(x, bool),
    "str": lambda x: isinstance(x, str),
    "num": lambda x: finite_number(x) is not None,
}


def get(
    body: dict[str, Any], key: str, kind: str, default: Any, lo: float | None = None, hi: float | None = None
) -> Any:
    """body[key] checked for type ("int" | "num" | "bool" | "str") and range; null = absent.
    Numbers are bounded by what the engine holds them in even where the API sets no limit: an
    int64 for integers, a float32 for the rest."""
    v = body.get(key)
    if v is None:
        return default
    ok = _KIND_OK[kind](v)
    if kind in ("int", "num"):
        top = INT64_MAX if kind == "int" else FLOAT32_MAX
        lo = -top - (kind == "int") if lo is None else lo
        hi = top if hi is None else hi
        ok = ok and lo <= v <= hi
    if not ok:
        want = {"int": "an integer", "num": "a number", "bool": "a boolean", "str": "a string"}
        rng = f" in [{show_num(lo)}, {show_num(hi)}]" if kind in ("int", "num") else ""
        raise OpenAIError(400, f"{key} must be {want[kind]}{rng}, got {show(v)}", key)
    return float(v) if kind == "num" else v


def show_num(x: Any) -> str:
    return str(x) if is_int(x) else f"{x:.7g}"


def send_openai_error(handler: RequestHandler, status: int, msg: str, param: str | None = None) -> None:
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json; charset=utf-8")
    handler.finish(json.dumps(error_body(status, msg, param), ensure_ascii=False))
