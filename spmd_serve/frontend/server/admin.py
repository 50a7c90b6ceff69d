"""The operator's endpoints on the service port, done by the engine between two steps
(engine/control.py) and answered once it has:

* `POST /reset_prefix_cache` (vLLM's): forget every cached prefix; 200 with no body.
* `GET|POST /flush_cache` (SGLang's): the same; 200 with SGLang's text.  Unlike SGLang's and vLLM's,
  both work while requests run: the blocks those share stay theirs and are found by no one new.
* `POST /abort_request` (SGLang's), `{"rid": "<id>"}` or `{"abort_all": true}`: the named request
  (its engine id: a native `req_id`, a `/generate` `rid` of one output) or every one ends now with
  the tokens it has, finish_reason "abort"; 200 with `{"aborted": [ids]}`.

They act on everyone's requests, so they want the API key when one is set.  An engine that is not
ready answers 503, one that does not answer within CONTROL_TIMEOUT_S (a step that long) 504.
"""

from __future__ import annotations

import asyncio
from typing import Any

from spmd_serve.engine.client import EngineClient, NotReadyError
from spmd_serve.frontend.common.http_base import AUTH_HINT, JsonBodyHandler
from spmd_serve.frontend.common.parsing import ProtocolError
from spmd_serve.frontend.openai.body import send_openai_error

CONTROL_TIMEOUT_S = 30.0
FLUSHED = "Cache flushed.\n"
ABORT_FIELDS = {"rid", "abort_all"}


class ControlHandler(JsonBodyHandler):
    """Asks the engine; errors in OpenAI's body, as on the routes beside them."""

    def initialize(self, client: EngineClient, max_body_size: int, api_key: str | None) -> None:  # type: ignore[override]
        super().initialize(max_body_size, api_key)
        self.client = client

    def send_error_body(self, status: int, msg: str) -> None:
        send_openai_error(self, status, msg)

    async def ask(self, op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """The engine's answer, or None once an error was sent."""
        status, msg, param = 0, "", None
        unknown = sorted(set(self.request.query_arguments))
        if not self.authorized():
            status, msg = 401, AUTH_HINT
        elif unknown:
            status, msg, param = 400, f"unknown query parameter {unknown[0]!r}", unknown[0]
        else:
            try:
                answer = await self.client.control(op, args, CONTROL_TIMEOUT_S)
            except NotReadyError as e:
                status, msg = 503, str(e)
            except asyncio.TimeoutError:
                status, msg = 504, f"the engine did not answer within {CONTROL_TIMEOUT_S:g} s"
            else:  # an error answer: our own front end sent what the engine could not read (a bug)
                if "error" not in answer:
                    return answer
                status, msg = 500, str(answer["error"])
        send_openai_error(self, status, msg, param)
        return None


class ResetPrefixCacheHandler(ControlHandler):
    async def post(self) -> None:
        if await self.ask("reset_prefix_cache", {}) is not None:
            self.finish()


class FlushCacheHandler(ControlHandler):
    async def get(self) -> None:
        if await self.ask("reset_prefix_cache", {}) is not None:
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(FLUSHED)

    post = get


class AbortRequestHandler(ControlHandler):
    async def post(self) -> None:
        try:
            args = abort_args(self.read_json()) if self.authorized() else {}  # (ask refuses the key)
        except ProtocolError as e:
            send_openai_error(self, e.status, e.msg, getattr(e, "param", None))
            return
        if (answer := await self.ask("abort", args)) is not None:
            self.finish({"aborted": answer["aborted"]})


def abort_args(body: dict[str, Any]) -> dict[str, Any]:
    """SGLang's AbortReq body as the engine's `abort` arguments; ProtocolError naming what is wrong."""
    if unknown := sorted(body.keys() - ABORT_FIELDS):
        raise ProtocolError(400, f"unknown field {unknown[0]!r}: /abort_request takes rid and abort_all")
    rid, every = body.get("rid", ""), body.get("abort_all", False)
    if not isinstance(rid, str):
        raise ProtocolError(400, "rid must be a string")
    if not isinstance(every, bool):
        raise ProtocolError(400, "abort_all must be true or false")
    if not (rid or every):
        raise ProtocolError(400, "give the rid of the request to abort, or abort_all: true")
    return {"req_ids": [] if every else [rid], "all": every, "why": "aborted by /abort_request"}


def admin_routes(client: EngineClient, max_body_size: int, api_key: str | None) -> list[tuple]:
    kw = {"client": client, "max_body_size": max_body_size, "api_key": api_key}
    return [(r"/reset_prefix_cache", ResetPrefixCacheHandler, kw), (r"/flush_cache", FlushCacheHandler, kw),
            (r"/abort_request", AbortRequestHandler, kw)]  # fmt: skip
