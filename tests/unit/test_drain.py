"""Stopping and failing, in-process and fast: the real Engine loop with fake ranks drains on stop
(in-flight requests finish, new ones get 503), gives up after the drain timeout or on a second
signal with an error frame (503), and always sends SHUTDOWN; health stays honest when a rank dies or
a step hangs; stop_server's escalation (SIGTERM, second SIGTERM, SIGKILL) on plain processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from spmd_serve.engine.client import EngineClient, NotReadyError
from spmd_serve.engine.engine import Engine
from spmd_serve.frontend.common.liveness import is_live, is_ready
from spmd_serve.frontend.server.peer_watch import PeerWatch
from spmd_serve.launcher import jobs
from spmd_serve.launcher.stop import last_cause
from spmd_serve.protocol import SHUTDOWN
from spmd_serve.sampling_params import SamplingParams
from tests.support.engine_rig import engine_rig

STEP_S = 0.01


@pytest.fixture
def rig():
    """A real Engine (fake ranks, STEP_S per step) running in a thread, its client on an IO loop."""
    yield from engine_rig(STEP_S)


def stop(eng: Engine) -> float:
    """What rank 0's first SIGTERM does; returns when."""
    eng.client.draining.set()
    eng.stop_event.set()
    eng.client.wake()
    return time.monotonic()


def wait_running(eng: Engine, req_id: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not any(r.req_id == req_id and r.num_output_tokens > 0 for r in list(eng.scheduler.running)):
        assert time.monotonic() < deadline, f"{req_id} never started"
        time.sleep(0.005)


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0)


def test_drain_lets_in_flight_requests_finish_and_refuses_new_ones(rig):
    start, client, io, comm = rig
    eng = start()
    queue = io.call(client.add_request, "long", [3, 4, 5], params(60))
    wait_running(eng, "long")
    stop(eng)
    with pytest.raises(NotReadyError, match="shutting down"):
        io.call(client.add_request, "late", [3], params(2))
    assert is_ready(client) == (False, "server is shutting down")
    outs = io.read_all(queue)
    assert outs[-1].finish_reason == "length" and outs[-1].error_code == 0
    assert sum(len(o.new_token_ids) for o in outs) == 60
    for _ in range(200):
        if comm.plans and comm.plans[-1].kind == SHUTDOWN:
            break
        time.sleep(0.01)
    assert comm.plans[-1].kind == SHUTDOWN


def test_drain_timeout_aborts_with_an_error_frame(rig):
    start, client, io, comm = rig
    eng = start(drain_timeout_s=0.3)
    queue = io.call(client.add_request, "long", [3, 4, 5], params(900))  # ~9 s of steps
    wait_running(eng, "long")
    t0 = stop(eng)
    outs = io.read_all(queue)
    waited = time.monotonic() - t0
    last = outs[-1]
    assert last.finished and last.error_code == 503 and "drain timeout" in last.error_msg
    assert 0.3 <= waited < 3, waited
    assert 0 < sum(len(o.new_token_ids) for o in outs) < 900
    assert eng.scheduler.block_manager.num_free_blocks == eng.scheduler.block_manager.num_blocks


def test_second_signal_aborts_the_drain_now(rig):
    start, client, io, comm = rig
    eng = start(drain_timeout_s=60)
    queue = io.call(client.add_request, "long", [3, 4, 5], params(900))
    wait_running(eng, "long")
    stop(eng)
    time.sleep(0.2)
    assert any(r.req_id == "long" for r in eng.scheduler.running)
    t0 = time.monotonic()
    eng.abort_event.set()
    outs = io.read_all(queue)
    assert time.monotonic() - t0 < 2
    assert outs[-1].error_code == 503 and outs[-1].error_msg == "server is shutting down"


def test_stop_when_idle_is_immediate(rig):
    start, client, io, comm = rig
    eng = start(drain_timeout_s=60)
    time.sleep(0.1)
    t0 = stop(eng)
    for _ in range(100):
        if comm.plans:
            break
        time.sleep(0.01)
    assert comm.plans and comm.plans[-1].kind == SHUTDOWN and time.monotonic() - t0 < 1


# ---- health honesty -----------------------------------------------------------------------------
def test_live_turns_503_when_a_step_hangs():
    client = EngineClient(capacity=1)
    client.busy_since = time.monotonic() - 5
    assert is_live(client, step_limit_s=10) == (True, "")  # a long step is not a hang ...
    ok, why = is_live(client, step_limit_s=4)  # ... up to a (generous) bound
    assert not ok and "running for 5 s" in why and "stuck" in why


def test_peer_watch_fails_everything_when_a_local_rank_dies():
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    async def scenario() -> None:
        client = EngineClient(capacity=4)
        client.ready.set()
        client.attach_loop(asyncio.get_running_loop())
        watch = PeerWatch(client, poll_s=0.05)
        watch.watch({1: peer.pid})
        await watch.start()
        queue = client.add_request("r", [1, 2], params(4))
        await asyncio.sleep(0.2)
        assert is_ready(client) == (True, "") and is_live(client)[0] and queue.empty()
        peer.kill()  # a zombie until reaped: already dead for the watch
        out = await asyncio.wait_for(queue.get(), 5)
        assert out.finished and out.error_code == 503 and f"rank 1 (pid {peer.pid})" in out.error_msg
        for check in (is_ready, is_live):
            ok, why = check(client)
            assert not ok and "rank 1" in why and "exited unexpectedly" in why
        with pytest.raises(NotReadyError):
            client.add_request("s", [1], params(1))
        await watch.stop(0)

    try:
        asyncio.run(scenario())
    finally:
        peer.kill()
        peer.wait(5)


# ---- stop_server's escalation, on plain processes --------------------------------------------
SLOW_TO_STOP = """
import os, signal, sys, time
mode = sys.argv[1]
def on_term(*_):
    global terms
    terms += 1
    if mode == "drains" or (mode == "aborts" and terms == 2):
        sys.exit(0)
terms = 0
signal.signal(signal.SIGTERM, on_term if mode != "stuck" else signal.SIG_IGN)
print("up", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("mode,outcome", [("drains", "drained"), ("aborts", "aborted"), ("stuck", "killed")])
def test_stop_job_escalates(mode, outcome):
    """rank 0 that drains in time / needs the second SIGTERM / ignores both (stuck)."""
    run_id = jobs.Job.new_run_id()
    env = dict(os.environ, **{jobs.RUN_ID_VAR: run_id, "OMPI_COMM_WORLD_RANK": "0"})
    proc = subprocess.Popen([sys.executable, "-c", SLOW_TO_STOP, mode], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"up\n"
        t0 = time.monotonic()
        res = jobs.stop_job(jobs.Job(proc.pid, run_id), timeout=0.5, abort_grace=0.5)
        assert res.outcome == outcome and res.found == 1
        assert res.killed == (1 if outcome == "killed" else 0)
        assert time.monotonic() - t0 < 5
        assert proc.wait(5) == (0 if outcome != "killed" else -9)
    finally:
        proc.kill()
        proc.wait(5)


def test_last_cause_finds_why_the_job_ended(tmp_path):
    log = tmp_path / "server.log"
    assert last_cause(log) is None
    log.write_text(
        "rank0 INFO ready\n" + "-" * 20 + "\nmpirun noticed that process rank 1 with PID 0 on "
        "node vm exited on signal 9 (Killed).\n" + "-" * 20 + "\n"
    )
    assert last_cause(log) == "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
    Path(log).write_text("all fine\n")
    assert last_cause(log) is None


def test_psutil_sees_a_killed_child_as_dead_before_it_is_reaped():
    """What PeerWatch relies on: mpirun may reap a killed rank late, a zombie counts as dead."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    p = psutil.Process(child.pid)
    child.kill()
    deadline = time.monotonic() + 5
    while p.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    watch = PeerWatch(EngineClient(capacity=1))
    watch.watch({3: child.pid})
    assert watch.dead() == [(3, child.pid)]
    child.wait(5)
    assert watch.dead() == [(3, child.pid)]
