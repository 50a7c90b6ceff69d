"""SIGTERM drains a real `mpirun -n 2 spmd_serve` (CONTRACT §1 stop_server, §3 503, §6 ready):
new requests and readiness get 503 at once, a request in flight finishes normally when it fits in
the drain timeout or ends with an error frame (503) when it does not, and the job exits 0."""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from tests.support import long_model
from tests.support.server_process import ServerProcess, Stream, rank_pid

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


def sigterm_rank0(srv: ServerProcess) -> float:
    os.kill(rank_pid(srv, 0), signal.SIGTERM)
    return time.monotonic()


def assert_refusing(srv: ServerProcess) -> None:
    """During the drain: readiness turns 503 as soon as rank 0 has handled the signal (its handler
    runs between two engine steps, so within milliseconds), and from then on new requests get 503."""
    ready_url = f"http://127.0.0.1:{srv.health_port}/v2/health/ready"
    deadline = time.monotonic() + 5
    while (ready := requests.get(ready_url, timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, "still ready 5 s after SIGTERM"
        time.sleep(0.01)
    assert ready.status_code == 503 and ready.json()["error_msg"] == "server is shutting down"
    res = requests.post(srv.url, json={"text": "hi", "max_dec_len": 2}, timeout=10)
    assert res.status_code == 503 and res.json()["error_code"] == 503
    assert res.json()["error_msg"] == "server is shutting down"


def test_sigterm_lets_the_request_in_flight_finish(served_tp2_long, tmp_path):
    # Long enough to outlast assert_refusing however late this process runs (400 tokens on the
    # 2,048-position model, ~1 s, once finished and the job exited before the first readiness poll
    # in a hogged CI run: connection refused), and a drain timeout it fits in with room to spare:
    # ~0.5-8 ms a token at TP=2 as the context grows, 3-48 s.
    n = 6000
    log = tmp_path / "server.log"
    env = {**long_model.SERVER_ENV, "SPMD_DRAIN_TIMEOUT_S": "200"}
    with ServerProcess(2, served_tp2_long, log, **env) as srv:
        stream = Stream(srv.url, n)
        assert stream.first()["is_end"] == 0
        sigterm_rank0(srv)
        assert_refusing(srv)
        frames = stream.rest(200)
        assert srv.proc.wait(30) == 0, srv.log()[-2000:]
    last = frames[-1]
    assert last["is_end"] == 1 and last["error_code"] == 0 and last["finish_reason"] == "length"
    assert last["tokens_all_num"] == n == sum(len(f["token_ids"]) for f in frames)
    assert all(f["error_code"] == 0 for f in frames)
    assert "draining: 1 request(s) in flight" in srv.log() and "engine stopped" in srv.log()


def test_drain_timeout_ends_the_request_with_an_error_frame(served_tp2_long, tmp_path):
    # minutes of decoding, far beyond the drain timeout; which leaves assert_refusing its seconds to
    # run inside the drain however late this process runs (1 s did not in a hogged CI run: the job had
    # ended, connection refused)
    n, drain = long_model.TOKENS, 5.0
    log = tmp_path / "server.log"
    with ServerProcess(2, served_tp2_long, log, SPMD_DRAIN_TIMEOUT_S=str(drain), **long_model.SERVER_ENV) as srv:
        stream = Stream(srv.url, n)
        stream.first()
        t0 = sigterm_rank0(srv)
        assert_refusing(srv)
        frames = stream.rest(30)
        rc = srv.proc.wait(30)
        exited = time.monotonic() - t0
    last, log, got = frames[-1], srv.log(), sum(len(f["token_ids"]) for f in frames)
    # the engine's own account (what was in flight at SIGTERM and at the deadline) when it fails
    why = f"{last}, {got} tokens, ended {stream.ended_at - t0:.2f} s after SIGTERM\n{log[-3000:]}"
    assert last["is_end"] == 1 and last["error_code"] == 503, why
    assert "drain timeout" in last["error_msg"]
    assert 0 < got < n
    assert drain <= stream.ended_at - t0 < drain + 5
    assert rc == 0 and exited < drain + 5, srv.log()[-2000:]
    assert f"drain timeout of {drain:g} s passed: aborting 1 request(s)" in srv.log()
