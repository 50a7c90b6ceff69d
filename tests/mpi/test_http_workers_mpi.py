"""PUSH_MODE_HTTP_WORKERS=2 under `mpirun -n 2 spmd_serve` (CONTRACT §2, issue 17 item 3): two
worker processes, children of rank 0 and no MPI ranks, share the public ports and serve native,
OpenAI and gRPC requests, with the same answers whichever worker a connection lands on; the
global rules hold across them (409 for a req_id in flight on the other one); a worker killed
with a request in flight has the request aborted in the engine and is started again while the
other one keeps serving; SIGTERM to rank 0 stops the workers too; a busy port is still one line."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import openai
import psutil
import pytest
import requests
import tritonclient.grpc as tg

from tests.support import long_model
from tests.support.failing_jobs import error_lines, run_with_busy_port
from tests.support.metrics_scrape import aborted
from tests.support.server_process import ServerProcess, rank_pid
from tests.support.triton_helpers import Stream, in_tensor, out_obj

pytestmark = pytest.mark.mpi
GREEDY = {"text": "Tell me about the sea.", "max_dec_len": 12, "temperature": 0}
# A request that must still be in flight while a test acts on it (minutes of decoding)
LONG = {"max_dec_len": long_model.TOKENS, "min_dec_len": long_model.TOKENS}


@pytest.fixture(scope="module")
def server(served_tp2_long, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with ServerProcess(2, served_tp2_long, log, PUSH_MODE_HTTP_WORKERS="2", **long_model.SERVER_ENV) as srv:
        yield srv


def fresh(server: ServerProcess, body: dict) -> requests.Response:
    """A request on a connection of its own (the kernel picks the worker per connection)."""
    return requests.post(server.url, json=body, headers={"Connection": "close"}, timeout=60)


def raw_stream(server: ServerProcess, body: dict) -> tuple[socket.socket, bytes]:
    """A native stream on a plain socket (its local port tells which worker holds it), read until
    its first frame."""
    data = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    got = b""
    while b'"send_idx": 0' not in got:
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    return sock, got


def worker_serving(server: ServerProcess, client: socket.socket) -> int:
    """The pid of the worker whose end of the connection is `client`."""
    port = client.getsockname()[1]
    for pid in server.http_worker_pids():
        for c in psutil.Process(pid).net_connections("tcp"):
            if c.raddr and c.raddr.port == port and c.laddr.port == server.http_port:
                return pid
    raise LookupError(f"no worker holds the connection from port {port}")


def test_two_worker_processes_that_are_no_ranks(server):
    pids = server.http_worker_pids()
    assert len(pids) == 2, pids
    for pid in pids:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not any(v.startswith((b"OMPI_", b"PMIX_")) for v in env)
        assert "spmd_serve.http_worker" in " ".join(psutil.Process(pid).cmdline())


def test_every_process_leaves_its_start_up_objects_out_of_full_collections(server):
    """gc.freeze() once started (a full collection walked the whole heap: 40-160 ms pauses of
    every stream), read from each process's heap report (`kill -USR2`)."""
    pids = [rank_pid(server, 0), rank_pid(server, 1), *server.http_worker_pids()]
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    assert fresh(server, GREEDY).status_code == 200  # (rank 1 reads its signal once a plan ends its wait)
    deadline, reports = time.monotonic() + 30, {}
    while len(reports) < 4 and time.monotonic() < deadline:
        found = (json.loads(m) for m in re.findall(r"heap-report (\{[^{}]*\})", server.log()))
        reports = {r["who"]: r for r in found}
        time.sleep(0.1)
    assert {"rank0", "rank1"} < set(reports) and sum(w.startswith("http") for w in reports) == 2, reports
    assert all(r["gc_frozen"] > 1000 for r in reports.values()), reports


def test_the_workers_run_on_the_nodes_cores_not_rank_0s(server):
    """Each rank is bound to its own half of the cores (SPMD_BIND_CORES); the workers rank 0 starts
    may use all of them (mpirun's, `--bind-to none`), so they can run while rank 1 waits."""
    job = os.sched_getaffinity(0)
    if len(job) < 2:
        pytest.skip("one core: there is nothing to bind")
    pids = server.http_worker_pids()
    rank0 = {psutil.Process(pid).ppid() for pid in pids}
    assert len(rank0) == 1
    assert len(os.sched_getaffinity(rank0.pop())) == len(job) // 2  # rank 0 is bound ...
    for pid in pids:  # ... and its children are not, nor any of their threads
        assert {frozenset(os.sched_getaffinity(t.id)) for t in psutil.Process(pid).threads()} == {frozenset(job)}


def test_the_workers_yield_to_the_ranks_threads_on_wakeup(server):
    """Every thread of a worker runs under SCHED_BATCH (a token's wake-up does not preempt a rank's
    compute thread); the ranks keep the default policy."""
    pids = server.http_worker_pids()
    for pid in pids:
        assert {os.sched_getscheduler(t.id) for t in psutil.Process(pid).threads()} == {os.SCHED_BATCH}
    for r in (0, 1):
        assert {os.sched_getscheduler(t.id) for t in psutil.Process(rank_pid(server, r)).threads()} == {os.SCHED_OTHER}


def test_native_answers_are_the_same_from_either_worker(server):
    answers = {tuple(fresh(server, GREEDY).json()["tokens_all_ids"]) for _ in range(16)}
    assert len(answers) == 1 and len(next(iter(answers))) == 12
    # 16 connections spread over both workers (SO_REUSEPORT hashes each one): both served
    served = {m for m in re.findall(r"http(\d) INFO tornado.access: 200 POST", server.log())}
    assert served == {"0", "1"}, server.log()[-2000:]


def test_openai_and_grpc_are_served(server):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0)
    done = client.completions.create(model="default", prompt="Once", max_tokens=5, extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    triton = tg.InferenceServerClient(f"127.0.0.1:{server.env['SERVICE_GRPC_PORT']}")
    try:
        assert triton.is_server_ready()
        unary = out_obj(triton.infer("model", in_tensor({**GREEDY, "req_id": "g1"})))
        assert unary["tokens_all_ids"] == fresh(server, GREEDY).json()["tokens_all_ids"]
        stream = Stream(triton)
        stream.send({**GREEDY, "req_id": "g2", "stream": True}, request_id="g2")
        frames = [frame for _, frame, _ in stream.collect(1, timeout=60)]
        assert sum((f["token_ids"] for f in frames), []) == unary["tokens_all_ids"]
    finally:
        triton.stop_stream()
        triton.close()


def test_a_req_id_in_flight_is_409_on_every_connection_and_a_cancel_frees_it(server):
    aborts = aborted(server)
    sock, _ = raw_stream(server, {"text": "go", "req_id": "dup", **LONG})
    codes = {fresh(server, {"text": "x", "req_id": "dup", "max_dec_len": 2}).status_code for _ in range(8)}
    assert codes == {409}
    cancelled = time.monotonic()
    sock.close()
    while (res := fresh(server, {"text": "x", "req_id": "dup", "max_dec_len": 2})).status_code == 409:
        assert time.monotonic() - cancelled < 30
    assert res.status_code == 200 and aborted(server) == aborts + 1
    print(f"req_id freed {1e3 * (time.monotonic() - cancelled):.0f} ms after the client went away")


def test_a_killed_worker_is_started_again_while_the_other_serves(served_tp2_long, tmp_path):
    log = tmp_path / "server.log"
    with ServerProcess(2, served_tp2_long, log, PUSH_MODE_HTTP_WORKERS="2", **long_model.SERVER_ENV) as srv:
        aborts = aborted(srv)
        body = {"text": "go", "req_id": "victim", **LONG}
        sock, _ = raw_stream(srv, body)
        victim = worker_serving(srv, sock)
        os.kill(victim, signal.SIGKILL)
        # Connections queued on the victim's listening sockets are reset as it dies (as in any
        # SO_REUSEPORT group).  Once rank 0 has reaped it (every thread gone, its sockets closed:
        # it logs the death then), the other worker gets every connection.
        deadline, killed = time.monotonic() + 60, f"(pid {victim}) was killed by signal SIGKILL; starting it again"
        while killed not in srv.log():
            assert time.monotonic() < deadline, srv.log()[-3000:]
            time.sleep(0.01)
        ready = f"http://127.0.0.1:{srv.health_port}/v2/health/ready"
        while not re.search(r"HTTP worker \d \(pid \d+\) connected", srv.log().partition(killed)[2]):
            assert time.monotonic() < deadline, srv.log()[-3000:]
            assert requests.get(ready, timeout=10).status_code == 200  # the other worker answers
            time.sleep(0.05)
        # The replacement's hello and the victim's end of file are separate events of rank 0's loop
        # (its order between them is the poller's), so the drop may be logged just after.
        gone = rf"\(pid {victim}\) disconnected \(.*\): 1 request\(s\) aborted"
        while not re.search(gone, srv.log()) or aborted(srv) != aborts + 1:
            assert time.monotonic() < deadline, (aborted(srv), aborts, srv.log()[-3000:])
            time.sleep(0.05)
        assert aborted(srv) == aborts + 1  # the engine stopped generating for the dead worker's client
        pids = srv.http_worker_pids()
        assert len(pids) == 2 and victim not in pids
        assert all(os.sched_getaffinity(p) == os.sched_getaffinity(0) for p in pids)  # a restart too
        assert all(os.sched_getscheduler(p) == os.SCHED_BATCH for p in pids)
        assert {fresh(srv, GREEDY).status_code for _ in range(8)} == {200}
        assert srv.stop_gracefully(60) == 0, srv.log()[-2000:]
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


@pytest.mark.parametrize("var", ["SERVICE_HTTP_PORT", "INTER_PROC_PORT"])
def test_a_busy_port_is_one_line_naming_it(served_tp2, var):
    res, port = run_with_busy_port(served_tp2, var, PUSH_MODE_HTTP_WORKERS="2")
    lines = error_lines(res)
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-2000:]
    assert f"127.0.0.1:{port} ({var})" in lines[0]
