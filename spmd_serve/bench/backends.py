"""One streamed request per call, for each protocol `spmd_serve bench` speaks.

Every backend forces the output length the same way the field does (vLLM's benchmark): OpenAI
`max_tokens` = `min_tokens` = N with `ignore_eos`; native and gRPC `min_dec_len` = `max_dec_len`
= N.  Greedy sampling (temperature 0) keeps runs repeatable.  A backend never raises: whatever
goes wrong (refused connection, HTTP error, an error frame mid-stream) becomes a failed
`RequestResult` with the message, so one bad request cannot stop a run.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from spmd_serve.bench.metrics import RequestResult
from spmd_serve.bench.prompts import Prompt

BACKENDS = ("openai-completions", "openai-chat", "native", "grpc")


@dataclass(frozen=True)
class Target:
    """Where and how to send: `base_url` is http://host:port (gRPC: host:port)."""

    backend: str
    base_url: str
    model: str = "default"
    output_len: int = 128
    api_key: str | None = None
    timeout_s: float = 600.0

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


RequestFn = Callable[[Any, Target, Prompt], Awaitable[RequestResult]]


def _fail(res: RequestResult, message: str) -> RequestResult:
    res.success, res.error = False, message[:500]
    return res


async def _post_lines(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    target: Target,
    on_line: Callable[[bytes, float], str | None],
    res: RequestResult,
) -> RequestResult:
    """POST `body`, feed each non-empty response line to `on_line` with the seconds since the
    send; `on_line` returns an error message to fail the request."""
    t0 = time.perf_counter()
    try:
        async with session.post(
            url, json=body, headers=target.headers(), timeout=aiohttp.ClientTimeout(total=target.timeout_s)
        ) as resp:
            if resp.status != 200:
                return _fail(res, f"HTTP {resp.status}: {(await resp.text())[:300]}")
            async for raw in resp.content:  # aiohttp splits the body on newlines
                line = raw.strip()
                if line:
                    err = on_line(line, time.perf_counter() - t0)
                    if err:
                        return _fail(res, err)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        return _fail(res, f"{e.__class__.__name__}: {e}")
    res.latency = time.perf_counter() - t0
    if res.output_tokens == 0:
        return _fail(res, "the stream ended without output")
    res.success = True
    return res


async def openai_request(session: aiohttp.ClientSession, target: Target, prompt: Prompt) -> RequestResult:
    """POST /v1/completions (token-id prompt) or /v1/chat/completions (text), streamed as SSE."""
    chat = target.backend == "openai-chat"
    n = target.output_len
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": n,
        "min_tokens": n,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.token_ids
    res = RequestResult(prompt_len=len(prompt.token_ids))
    usage: dict[str, int] = {}

    def on_line(line: bytes, elapsed: float) -> str | None:
        if not line.startswith(b"data:"):
            return None  # SSE comments / keep-alives
        data = line[5:].strip()
        if data == b"[DONE]":
            return None
        chunk = json.loads(data)
        if "error" in chunk:
            return f"error event: {chunk['error']}"
        if chunk.get("usage"):
            usage.update(chunk["usage"])
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if text:  # as vLLM: a chunk with output text is a token
                res.add_chunk(elapsed)
        return None

    path = "/v1/chat/completions" if chat else "/v1/completions"
    await _post_lines(session, target.base_url + path, body, target, on_line, res)
    if usage:  # the server's counts are exact where chunks merge tokens or a template adds some
        res.prompt_len = usage.get("prompt_tokens", res.prompt_len)
        res.output_tokens = usage.get("completion_tokens", res.output_tokens)
    return res


def native_body(target: Target, prompt: Prompt) -> dict[str, Any]:
    """The native request (CONTRACT §3) both the native HTTP and the gRPC backends send."""
    n = target.output_len
    return {
        "req_id": uuid.uuid4().hex,
        "input_ids": prompt.token_ids,
        "min_dec_len": n,
        "max_dec_len": n,
        "temperature": 0.0,
        "stream": True,
        "return_usage": True,
        "timeout": target.timeout_s,
    }


class _NativeFrames:
    """Turns native frames into chunk records; shared by the NDJSON and gRPC backends."""

    def __init__(self, res: RequestResult) -> None:
        self.res, self.ended = res, False

    def frame(self, f: dict, elapsed: float) -> str | None:
        if f.get("error_code"):
            return f"error {f['error_code']}: {f.get('error_msg', '')}"
        self.res.add_chunk(elapsed, len(f.get("token_ids") or []))
        if f.get("is_end"):
            self.ended = True
            usage = f.get("usage") or {}
            self.res.prompt_len = usage.get("prompt_tokens", self.res.prompt_len)
            self.res.output_tokens = f.get("tokens_all_num", self.res.output_tokens)
        return None


async def native_request(session: aiohttp.ClientSession, target: Target, prompt: Prompt) -> RequestResult:
    """POST the native protocol (NDJSON stream) to /v1/chat/completions."""
    res = RequestResult(prompt_len=len(prompt.token_ids))
    frames = _NativeFrames(res)
    await _post_lines(
        session,
        target.base_url + "/v1/chat/completions",
        native_body(target, prompt),
        target,
        lambda line, t: frames.frame(json.loads(line), t),
        res,
    )
    if res.success and not frames.ended:
        _fail(res, "the stream ended without a final frame")
    return res


async def grpc_request(client: Any, target: Target, prompt: Prompt) -> RequestResult:
    """Triton ModelStreamInfer: IN = a JSON list holding the native request, one OUT frame per
    response; the stream is kept open until the final one (`triton_final_response`)."""
    import numpy as np
    import tritonclient.grpc.aio as tga
    from tritonclient.utils import InferenceServerException

    res = RequestResult(prompt_len=len(prompt.token_ids))
    frames = _NativeFrames(res)
    inp = tga.InferInput("IN", [1], "BYTES")
    inp.set_data_from_numpy(np.array([json.dumps([native_body(target, prompt)]).encode()], dtype=object))
    done = asyncio.Event()

    async def requests():
        yield {"model_name": "model", "inputs": [inp], "request_id": uuid.uuid4().hex}
        await done.wait()  # half-closing early could end the stream

    t0 = time.perf_counter()
    try:
        async for result, error in client.stream_infer(
            requests(), stream_timeout=target.timeout_s, headers=target.headers()
        ):
            if error is not None:
                return _fail(res, f"gRPC {error.status()}: {error.message()}")
            frame = json.loads(result.as_numpy("OUT")[0])[0]
            err = frames.frame(frame, time.perf_counter() - t0)
            if err:
                return _fail(res, err)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    except (InferenceServerException, asyncio.TimeoutError, OSError) as e:
        return _fail(res, f"{e.__class__.__name__}: {e}")
    finally:
        done.set()
    res.latency = time.perf_counter() - t0
    if not frames.ended:
        return _fail(res, "the stream ended without a final frame")
    res.success = res.output_tokens > 0
    return res if res.success else _fail(res, "no output")


def request_fn(backend: str) -> RequestFn:
    return {
        "openai-completions": openai_request,
        "openai-chat": openai_request,
        "native": native_request,
        "grpc": grpc_request,
    }[backend]
