"""RemoteEngineClient, the worker side of INTER_PROC_PORT, fed frames by hand (no socket): a
req_id reused right after an abort never receives the aborted request's outputs still on their
way; the engine's state and heartbeats become the client's readiness and liveness; a refusal by
the hub is the request's only output; fail_all ends every request and tells the engine."""

from __future__ import annotations

import asyncio

import pytest

from spmd_serve.engine.client import DuplicateRequestError, NotReadyError
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.engine.remote_client import RemoteEngineClient
from spmd_serve.engine.wire import FrameDecoder, Message, output_to_wire
from spmd_serve.frontend.common.liveness import is_live, is_ready
from spmd_serve.sampling_params import SamplingParams


class Writer:
    """Collects the frames the client writes."""

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.sent: list[Message] = []

    def write(self, data: bytes) -> None:
        self.sent += self.decoder.feed(data)

    def is_closing(self) -> bool:
        return False


def connected_client() -> tuple[RemoteEngineClient, Writer]:
    client, writer = RemoteEngineClient(capacity=4), Writer()
    client.connected(writer)  # type: ignore[arg-type]
    client.on_message({"t": "state", "ready": True, "draining": False, "failure": ""})
    return client, writer


def out(n: int, tokens: list[int], finished: bool = False) -> Message:
    item = output_to_wire(RequestOutput("ignored", tokens, finished, "length" if finished else None), n)
    return {"t": "out", "at": 0.0, "o": [item]}


def test_reused_req_id_gets_only_its_own_outputs():
    async def scenario() -> None:
        client, writer = connected_client()
        old = client.add_request("x", [1, 2], SamplingParams(max_tokens=8))
        client.on_message(out(1, [10]))
        assert old.get_nowait().new_token_ids == [10]
        client.abort("x")
        new = client.add_request("x", [3], SamplingParams(max_tokens=8))
        client.on_message(out(1, [11]))  # computed for the old one before the engine saw the abort
        assert new.empty() and old.empty()
        client.on_message(out(2, [20], finished=True))
        assert new.get_nowait().new_token_ids == [20] and client.num_in_flight == 0
        sent = [(m["t"], m["n"], m.get("id")) for m in writer.sent]
        assert sent == [("add", 1, "x"), ("abort", 1, None), ("add", 2, "x")]

    asyncio.run(scenario())


def test_state_and_beats_are_readiness_and_liveness():
    client = RemoteEngineClient(capacity=4)
    assert is_ready(client) == (False, "model is not loaded yet")
    with pytest.raises(NotReadyError):  # not connected and not ready
        client.add_request("a", [1], SamplingParams())
    client.on_message({"t": "state", "ready": True, "draining": False, "failure": ""})
    assert is_ready(client) == (True, "")
    client.heartbeat -= 60
    assert not is_live(client, 10.0)[0]
    client.on_message({"t": "beat", "busy": True})  # a step started: live while it runs
    assert client.busy_since is not None and is_live(client, 10.0) == (True, "")
    client.on_message({"t": "beat", "busy": False})
    assert client.busy_since is None and is_live(client, 10.0) == (True, "")
    client.on_message({"t": "state", "ready": True, "draining": True, "failure": ""})
    assert is_ready(client) == (False, "server is shutting down")


def test_a_refusal_by_the_hub_is_the_only_output_and_local_duplicates_are_caught_here():
    async def scenario() -> None:
        client, _ = connected_client()
        q = client.add_request("d", [1], SamplingParams())
        with pytest.raises(DuplicateRequestError):
            client.add_request("d", [1], SamplingParams())
        refusal = RequestOutput.error("d", 409, "req_id 'd' is already in flight")
        client.on_message({"t": "out", "at": 0.0, "o": [output_to_wire(refusal, 1)]})
        got = q.get_nowait()
        assert (got.finished, got.error_code, got.error_msg) == (True, 409, refusal.error_msg)
        assert client.num_in_flight == 0

    asyncio.run(scenario())


def test_fail_all_ends_every_request_and_tells_the_engine():
    async def scenario() -> None:
        client, writer = connected_client()
        queues = [client.add_request(r, [1], SamplingParams()) for r in ("a", "b")]
        client.fail_all(503, "rank 1 (pid 7) exited unexpectedly")
        for q in queues:
            got = q.get_nowait()
            assert got.error_code == 503 and "rank 1" in got.error_msg
        assert client.num_in_flight == 0 and client.num_open == 2  # their handlers still answer
        assert sorted(m["n"] for m in writer.sent if m["t"] == "abort") == [1, 2]
        for r in ("a", "b"):
            client.abort(r)  # the handlers close their generations
        assert client.num_open == 0

    asyncio.run(scenario())


def test_a_replacement_started_ready_queues_requests_behind_its_hello():
    """A worker restarted while the server is ready answers ready before its link is up (it has
    joined the public ports: a 503 there would be a flapping health check); what it is sent
    meanwhile follows the hello, and nothing is queued once the link is gone."""

    async def scenario() -> None:
        client, writer = RemoteEngineClient(4, {"ready": True, "draining": False, "failure": ""}), Writer()
        assert is_ready(client) == (True, "")
        client.add_request("early", [1], SamplingParams(max_tokens=2))
        assert writer.sent == []
        client.connected(writer, {"t": "hello", "worker": 1})  # type: ignore[arg-type]
        assert [(m["t"], m.get("id")) for m in writer.sent] == [("hello", None), ("add", "early")]
        client.connected(None)
        with pytest.raises(NotReadyError):
            client.add_request("late", [1], SamplingParams())

    asyncio.run(scenario())
