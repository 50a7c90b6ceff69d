"""No request can stop the server (issue 17 item 0): a property-based campaign (hypothesis) over every
field of the native, OpenAI (completions and chat) and gRPC requests — extreme integers and floats,
NaN, unicode, wrong types, nesting, unknown keys, bodies that are not JSON — against one
`mpirun -n 2 spmd_serve` on the demo model.  Every body gets a contract answer (never a 500, never
503 "not ready"), and after every body the server is still ready and both ranks are alive.

Each field gets its own examples (a sensible body with that one field drawn at its bounds), then
bodies mixing every field, then bytes that are no request at all.  Bounded for CI: MAX_DEC_LEN=8
keeps every accepted request short, and the examples are fixed and drawn deterministically
(`derandomize`); FUZZ_EXAMPLES=N runs N examples per case with fresh draws (a longer campaign).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import requests
import tritonclient.grpc as tg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from spmd_serve.frontend.common.vllm_extras import NOT_BUILT, OPENAI_EXTRAS
from spmd_serve.frontend.native import protocol as native_protocol
from tests.support import request_strategies as rs
from tests.support.server_process import ServerProcess
from tests.support.triton_helpers import Stream, in_tensor, out_obj

pytestmark = pytest.mark.mpi

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))


def campaign(n: int) -> settings:
    return settings(
        max_examples=EXAMPLES or n,
        derandomize=not EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


# what a client may be told; 500 (a bug) and 503 (the server no longer ready) never
HTTP_OK = {200, 400, 404, 409, 413, 429, 504}
GRPC_OK = {"StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND", "StatusCode.ALREADY_EXISTS"}
GRPC_OK |= {"StatusCode.RESOURCE_EXHAUSTED", "StatusCode.DEADLINE_EXCEEDED"}
PATHS = {"native": "/v1/chat/completions", "completion": "/v1/completions", "chat": "/v1/chat/completions"}


@pytest.fixture(scope="module")
def server(served_tp2, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    with ServerProcess(2, served_tp2, logs, MAX_DEC_LEN="8", MAX_SEQ_LEN="512") as srv:
        yield srv


@pytest.fixture(scope="module")
def triton(server):
    client = tg.InferenceServerClient(f"127.0.0.1:{server.env['SERVICE_GRPC_PORT']}")
    yield client
    client.close()


def assert_still_serving(server: ServerProcess, what: bytes) -> None:
    assert server.proc.poll() is None, f"the job ended after {what[:300]!r}:\n{server.log()[-3000:]}"
    ready = requests.get(f"http://127.0.0.1:{server.health_port}/v2/health/ready", timeout=30)
    assert ready.status_code == 200, f"not ready after {what[:300]!r}: {ready.text}"


def check_http(server: ServerProcess, path: str, raw: bytes) -> None:
    url = f"http://127.0.0.1:{server.http_port}{path}"
    res = requests.post(url, data=raw, headers={"Content-Type": "application/json"}, stream=True, timeout=60)
    try:
        assert res.status_code in HTTP_OK, f"{res.status_code} for {raw[:300]!r}: {res.text[:300]}"
        for line in res.iter_lines():
            line = line.removeprefix(b"data: ")  # OpenAI's SSE
            if line in (b"", b"[DONE]"):
                continue
            obj = json.loads(line)  # every answer is JSON, frames and errors alike
            code = obj.get("error_code") or (obj.get("error") or {}).get("code") or 0
            assert code in HTTP_OK | {0}, f"error {code} for {raw[:300]!r}: {obj}"
    finally:
        res.close()
    assert_still_serving(server, raw)


def check_grpc(server: ServerProcess, triton: tg.InferenceServerClient, raw: bytes, streamed: bool) -> None:
    try:
        if streamed:
            stream = Stream(triton)
            try:
                stream.send(raw, request_id="fuzz")
                for _, frame, _ in stream.collect(1, timeout=60):
                    if isinstance(frame, InferenceServerException):
                        assert frame.status() in GRPC_OK | {None}, f"{frame} for {raw[:300]!r}"
                    else:
                        assert frame.get("error_code", 0) in HTTP_OK | {0}, f"{frame} for {raw[:300]!r}"
            finally:
                triton.stop_stream()
        else:
            out_obj(triton.infer("model", in_tensor(raw), client_timeout=60))
    except InferenceServerException as e:
        assert e.status() in GRPC_OK, f"{e.status()} {e.message()} for {raw[:300]!r}"
    assert_still_serving(server, raw)


def test_every_native_field_has_a_strategy():
    parsed = {f.name for f in dataclasses.fields(native_protocol.NativeRequest)}
    aliases = {a for names in native_protocol._ALIASES.values() for a in names}
    # and vLLM's extras, refused unless neutral (the OpenAI API's too)
    assert set(rs.NATIVE) == parsed | aliases | set(NOT_BUILT) | set(OPENAI_EXTRAS)


@pytest.mark.parametrize("name", sorted(rs.NATIVE))
@campaign(4)
@given(data=st.data())
def test_native_field_at_its_bounds(server, name, data):
    check_http(server, PATHS["native"], json.dumps(data.draw(rs.body_varying("native", name))).encode())


@pytest.mark.parametrize("kind, name", [(k, n) for k in ("completion", "chat") for n in sorted(rs.OPENAI[k])])
@campaign(2)
@given(data=st.data())
def test_openai_field_at_its_bounds(server, kind, name, data):
    check_http(server, PATHS[kind], json.dumps(data.draw(rs.body_varying(kind, name))).encode())


@pytest.mark.parametrize("name", sorted(rs.NATIVE))
@campaign(2)
@given(data=st.data(), streamed=st.booleans())
def test_grpc_field_at_its_bounds(server, triton, name, data, streamed):
    check_grpc(server, triton, json.dumps(data.draw(rs.body_varying("native", name))).encode(), streamed)


@pytest.mark.parametrize("protocol", ["native", "completion", "chat", "grpc"])
@campaign(25)
@given(data=st.data())
def test_mixed_bodies_and_junk_bytes(server, triton, protocol, data):
    raw = data.draw(rs.encoded(rs.mixed_body("native" if protocol == "grpc" else protocol)))
    if protocol == "grpc":
        check_grpc(server, triton, raw, data.draw(st.booleans()))
    else:
        check_http(server, PATHS[protocol], raw)
