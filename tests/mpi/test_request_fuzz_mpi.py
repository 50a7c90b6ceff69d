"""No request can stop the server (issue 17 item 0): a property-based campaign (hypothesis) over every
field of the native, OpenAI (completions and chat) and gRPC requests — extreme integers and floats,
NaN, unicode, wrong types, nesting, unknown keys, bodies that are not JSON — against one
`mpirun -n 2 spmd_serve` on the demo model.  Every body gets a contract answer (never a 500, never
503 "not ready"), and after every body the server is still ready and both ranks are alive.

Bounded for CI: MAX_DEC_LEN=8 keeps every accepted request short, the examples per door are fixed
and drawn deterministically (`derandomize`); FUZZ_EXAMPLES=N runs N per door with fresh draws.
"""

from __future__ import annotations

import json
import os

import pytest
import requests
import tritonclient.grpc as tg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from tests.support import request_strategies as rs
from tests.support.server_process import ServerProcess
from tests.support.triton_helpers import Stream, in_tensor, out_obj

pytestmark = pytest.mark.mpi

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))
CAMPAIGN = settings(
    max_examples=EXAMPLES or 60,
    derandomize=not EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# what a client may be told; 500 (a bug) and 503 (the server no longer ready) never
HTTP_OK = {200, 400, 404, 409, 413, 429, 504}
GRPC_OK = {"StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND", "StatusCode.ALREADY_EXISTS"}
GRPC_OK |= {"StatusCode.RESOURCE_EXHAUSTED", "StatusCode.DEADLINE_EXCEEDED"}


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
    with open("/tmp/fuzz_stats.txt", "a") as f:
        f.write(f"{path} {res.status_code} {res.text[:150]!r}\n" if res.status_code != 200 else f"{path} 200\n")
    try:
        assert res.status_code in HTTP_OK, f"{res.status_code} for {raw[:300]!r}: {res.text[:300]}"
        for line in res.iter_lines():
            if line.startswith(b"data: "):  # OpenAI SSE
                line = line[len(b"data: ") :]
                if line == b"[DONE]":
                    continue
            if not line:
                continue
            obj = json.loads(line)  # every answer is JSON, frames and errors alike
            code = obj.get("error_code") or (obj.get("error") or {}).get("code") or 0
            assert code in HTTP_OK | {0}, f"error {code} for {raw[:300]!r}: {obj}"
    finally:
        res.close()
    assert_still_serving(server, raw)


@CAMPAIGN
@given(raw=rs.encoded(rs.native_bodies()))
def test_native_bodies_never_stop_the_server(server, raw):
    check_http(server, "/v1/chat/completions", raw)


@CAMPAIGN
@given(kind=st.sampled_from(["completions", "chat"]), data=st.data())
def test_openai_bodies_never_stop_the_server(server, kind, data):
    bodies = rs.completion_bodies() if kind == "completions" else rs.chat_bodies()
    raw = data.draw(rs.encoded(bodies))
    path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"  # no "model": native
    check_http(server, path, raw)


@CAMPAIGN
@given(raw=rs.encoded(rs.native_bodies()), streamed=st.booleans())
def test_grpc_requests_never_stop_the_server(server, triton, raw, streamed):
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
