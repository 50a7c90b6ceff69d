"""`GET /openapi.json` (CONTRACT.md §4): an OpenAPI 3.1 document of the service port.

This module owns that document and the handler that serves it.  It describes every route of
`make_service_app`: the native API and OpenAI chat sharing `POST /v1/chat/completions` (told
apart by the presence of "model"), `/v1/completions`, `/v1/responses`, the legacy doubled paths, the model lists,
vLLM's /tokenize and /detokenize, the health aliases and this document itself.  Ranges, enums
and required fields are the ones the parsers (native.protocol, openai.protocol) enforce; limits
come from this server's settings, so the document describes the running server, not a generic one.
Rules a JSON Schema cannot state (prompt length in tokens, min <= max, vocabulary size) are in
descriptions and end in a 400.
"""

from __future__ import annotations

import json
from typing import Any

from tornado.web import RequestHandler

from spmd_serve import __version__
from spmd_serve.frontend.server.openapi_generate import generate_schemas
from spmd_serve.frontend.server.openapi_messages import messages_schemas
from spmd_serve.frontend.server.openapi_responses import responses_schemas
from spmd_serve.frontend.server.openapi_schemas import JSON, NDJSON, SSE, Schema, ref, schemas
from spmd_serve.frontend.server.settings import IOSettings

_WHY = {
    400: "invalid field (named in the message), too long, or body not a JSON object",
    401: "API_KEY is set and the request lacks `Authorization: Bearer <key>`",
    404: "unknown model (a path under /v1/ that does not exist: the same body)",
    409: "req_id already in flight",
    429: "waiting queue full (MAX_CACHED_TASK_NUM)",
    500: "the engine failed on this request, or an internal error",
    503: "model not loaded yet, or draining",
    504: "the request's deadline passed before it finished",
}


def _errors(codes: tuple[int, ...], schema: Schema, s: IOSettings) -> dict[str, Any]:
    why = {**_WHY, 413: f"request body larger than {s.max_body_size} bytes"}
    return {
        str(c): {"description": why[c], "content": {JSON: {"schema": schema}}} for c in codes if c != 401 or s.api_key
    }  # 401 only where a key is asked for


def _post(
    summary: str, request: Schema, ok: dict[str, Schema], codes: tuple[int, ...], error: Schema, s: IOSettings
) -> dict[str, Any]:
    streamed = " or ".join(mt for mt in ok if mt != JSON)
    op: dict[str, Any] = {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": request}}},
        "responses": {
            "200": {
                "description": f"{JSON}: the whole answer; with stream: true, {streamed}, one object per line / "
                "event (SSE ends with `data: [DONE]`)"
                if streamed
                else f"{JSON}: the answer",
                "content": {mt: {"schema": sch} for mt, sch in ok.items()},
            },
            **_errors(codes, error, s),
        },
    }
    if s.api_key:
        op["security"] = [{"bearer": []}]
    return op


def _get(summary: str, ok: Schema, errors: dict[str, Any], s: IOSettings, auth: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "OK", "content": {JSON: {"schema": ok}}}, **errors},
    }
    if auth and s.api_key:
        op["security"] = [{"bearer": []}]
    return op


def _sse(chunk: str) -> Schema:
    return {"anyOf": [ref(chunk), ref("OpenAIError")]}


def openapi_document(s: IOSettings) -> dict[str, Any]:
    """The service port's API as an OpenAPI 3.1 document (plain data, ready for json.dumps)."""
    either = {"anyOf": [ref("NativeError"), ref("OpenAIError")]}
    gen_codes = (400, 401, 404, 413, 429, 500, 503, 504)
    # a failure after the SSE stream began is an OpenAI error object as the last event
    completion = _post(
        "OpenAI completion",
        ref("CompletionRequest"),
        {JSON: ref("Completion"), SSE: _sse("CompletionChunk")},
        gen_codes,
        ref("OpenAIError"),
        s,
    )
    openai_chat = _post(
        "OpenAI chat completion",
        ref("ChatCompletionRequest"),
        {JSON: ref("ChatCompletion"), SSE: _sse("ChatCompletionChunk")},
        gen_codes,
        ref("OpenAIError"),
        s,
    )
    chat = _post(
        'Native request (no "model") or OpenAI chat completion (with "model")',
        {"oneOf": [ref("NativeRequest"), ref("ChatCompletionRequest")]},
        {
            JSON: {"anyOf": [ref("NativeResult"), ref("ChatCompletion")]},
            NDJSON: ref("NativeFrame"),
            SSE: _sse("ChatCompletionChunk"),
        },
        (400, 401, 404, 409, 413, 429, 500, 503, 504),
        either,
        s,
    )
    responses = _post("OpenAI Responses API: the chat answer as a Response", ref("ResponsesRequest"),
                      {JSON: ref("Response"), SSE: _sse("ResponseEvent")}, gen_codes,
                      ref("OpenAIError"), s)  # fmt: skip
    responses["responses"]["200"]["description"] = (
        f"{JSON}: the Response; with stream: true, {SSE}: `event: <type>` and `data: <event>`, the last "
        "response.completed or response.incomplete (an error event after a failure), no [DONE]"
    )
    messages = _post("Anthropic Messages API: the chat answer as a Message", ref("MessagesRequest"),
                     {JSON: ref("Message"), SSE: ref("MessageEvent")}, gen_codes, ref("AnthropicError"), s)  # fmt: skip
    messages["responses"]["200"]["description"] = (
        f"{JSON}: the Message; with stream: true, {SSE}: `event: <type>` and `data: <event>`, the last "
        "message_stop (an error event after a failure); the key may also come as x-api-key"
    )
    count = _post("Anthropic's count_tokens: the prompt a Messages body is served with", ref("CountTokensRequest"),
                  {JSON: ref("TokenCount")}, (400, 401, 404, 413), ref("AnthropicError"), s)  # fmt: skip
    generate = _post("SGLang's /generate: a prompt or a batch, SGLang's sampling_params and output",
                     ref("GenerateRequest"), {JSON: ref("GenerateAnswer"), SSE: _sse("GenerateOutput")}, gen_codes,
                     ref("OpenAIError"), s)  # fmt: skip
    tokenize = _post("vLLM's /tokenize: a prompt's or chat's token ids", ref("TokenizeRequest"),
                     {JSON: ref("Tokenized")}, (400, 401, 404, 413), ref("OpenAIError"), s)  # fmt: skip
    detokenize = _post("vLLM's /detokenize: token ids' text, special tokens written", ref("DetokenizeRequest"),
                       {JSON: ref("Detokenized")}, (400, 401, 404, 413), ref("OpenAIError"), s)  # fmt: skip
    unhealthy = {"503": {"description": "not ready, draining, or no token within 20 s",
                         "content": {JSON: {"schema": ref("OpenAIError")}}}}  # fmt: skip
    health_generate = _get("SGLang's /health_generate: 200 (no body) once one token is generated", {}, unhealthy, s)
    health_generate["responses"]["200"] = {"description": "healthy (no body)"}
    model_info = _get("SGLang's /get_model_info: the served model", ref("ModelInfo"), {}, s)
    models = _get("Served model names", ref("ModelList"), _errors((401,), ref("OpenAIError"), s), s, auth=True)
    model = _get("One served model", ref("Model"), _errors((401, 404), ref("OpenAIError"), s), s, auth=True)
    model["parameters"] = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    down = {"503": {"description": "not live / not ready", "content": {JSON: {"schema": ref("HealthError")}}}}
    live = _get("Liveness: the engine loop is beating", ref("HealthOk"), down, s)
    ready = _get("Readiness: model loaded on every rank, not draining", ref("HealthOk"), down, s)
    # HEAD answers the same statuses without a body (load balancers probe with it)
    bare = {
        "responses": {
            "200": {"description": "live / ready (no body)"},
            "503": {"description": "not live / not ready (no body)"},
        }
    }
    control = _errors((401, 500, 503, 504), ref("OpenAIError"), s)  # (500: the engine could not read it, a bug)
    reset = _get("vLLM's /reset_prefix_cache: forget every cached prefix (also while requests run)", {}, control, s,
                 auth=True)  # fmt: skip
    reset["responses"]["200"] = {"description": "forgotten (no body)"}
    flush = _get("SGLang's /flush_cache: the same", {}, control, s, auth=True)
    flush["responses"]["200"] = {
        "description": "Cache flushed.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    abort = _post(
        "SGLang's /abort_request: end a request (its rid, a native req_id) or all now, finish_reason abort",
        ref("AbortRequest"),
        {JSON: ref("Aborted")},
        (400, 401, 413, 500, 503, 504),
        ref("OpenAIError"),
        s,
    )
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "spmd_serve",
            "version": __version__,
            "description": "Native (CONTRACT §3) and OpenAI-compatible (§4) HTTP API.",
        },
        "paths": {
            "/v1/chat/completions": {"post": chat},
            "/v1/completions": {"post": completion},
            "/v1/responses": {"post": responses},
            "/v1/messages": {"post": messages},
            "/v1/messages/count_tokens": {"post": count},
            "/generate": {"post": generate},
            "/health_generate": {"get": health_generate},
            "/get_model_info": {"get": model_info},
            "/reset_prefix_cache": {"post": reset},
            "/flush_cache": {"get": flush, "post": flush},
            "/abort_request": {"post": abort},
            "/v1/chat/completions/completions": {"post": completion},
            "/v1/chat/completions/chat/completions": {"post": openai_chat},
            "/v1/models": {"get": models},
            "/v1/models/{name}": {"get": model},
            "/v1/chat/completions/models": {"get": models},
            "/v1/chat/completions/models/{name}": {"get": model},
            "/tokenize": {"post": tokenize},
            "/detokenize": {"post": detokenize},
            "/health": {"get": live, "head": bare},
            "/v2/health/live": {"get": live, "head": bare},
            "/v2/health/ready": {"get": ready, "head": bare},
            "/openapi.json": {"get": _get("This document", {"type": "object"}, {}, s)},
        },
        "components": {
            "schemas": (table := schemas(s))
            | responses_schemas(s, table["ChatCompletionRequest"])
            | messages_schemas(s, table["ChatCompletionRequest"])
            | generate_schemas(s, table["CompletionRequest"])
        },
    }
    if s.api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc


class OpenAPIHandler(RequestHandler):
    """Serves the document, rendered once: it depends only on the settings."""

    def initialize(self, body: str) -> None:
        self.body = body

    def get(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(self.body)


def openapi_route(settings: IOSettings) -> tuple[str, type, dict[str, Any]]:
    return (r"/openapi.json", OpenAPIHandler, {"body": json.dumps(openapi_document(settings))})
