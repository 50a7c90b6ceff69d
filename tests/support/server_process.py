"""Test helper: run `mpirun -n N spmd_serve` (or any command) as a real process group on free
loopback ports, wait for readiness, and always stop it (SIGTERM, then SIGKILL after a timeout);
read a long native stream in the background while a test stops or breaks the server.

A server whose test never reached its teardown (pytest ended by SIGTERM, which tests/conftest.py
turns into KeyboardInterrupt so that teardowns run) is killed at interpreter exit: a job left
behind holds its ports and both cores while the next run starts."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

VENV_BIN = Path(sys.executable).parent


# Test servers' ports come from a range below the kernel's ephemeral one (32768-60999 on Linux), one
# slice per test lane (SPMD_TEST_PORT_LANE, set by launch/run_tests.sh): a port checked free here and
# released is bound by its server a moment later, and in between neither an outgoing connection (its
# port is ephemeral) nor the other lane (its own slice) can take it. Within a process each port is
# handed out once per walk of the slice; the pid picks where the walk starts, so two test runs in
# one lane (a developer's beside CI's) start apart, and every port is still bind-checked.
PORT_RANGE_START = 20000
PORT_LANE_SPAN = 5000
_port_walk = itertools.count()
_port_lock = threading.Lock()


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports from this lane's slice (all bound at once while checked)."""
    lane = int(os.environ.get("SPMD_TEST_PORT_LANE", "0"))
    base = PORT_RANGE_START + lane * PORT_LANE_SPAN
    start = os.getpid() % PORT_LANE_SPAN
    socks: list[socket.socket] = []
    try:
        with _port_lock:
            for _ in range(PORT_LANE_SPAN):
                if len(socks) == n:
                    break
                port = base + (start + next(_port_walk)) % PORT_LANE_SPAN
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:  # in use, or lingering in TIME_WAIT: the next one
                    s.close()
                    continue
                socks.append(s)
        if len(socks) < n:
            raise RuntimeError(f"no {n} free ports in {base}..{base + PORT_LANE_SPAN - 1}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def mpi_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        GLOG_minloglevel="2",
        OMPI_MCA_btl_vader_single_copy_mechanism="none",
        PYTHONUNBUFFERED="1",
    )
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def mpirun(n: int, *args: str) -> list[str]:
    return ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none", *args]


_started: set[ServerProcess] = set()  # started and not stopped yet


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (a server's mpirun and its ranks: Open MPI puts each
    rank in a process group of its own, so killing mpirun's group would leave the ranks running)."""
    subprocess.run(["pkill", "-KILL", "-s", str(sid)], check=False)  # like children(): procps


@atexit.register
def _kill_left_behind() -> None:
    for server in list(_started):
        if server.proc is not None:
            kill_session(server.proc.pid)


class ServerProcess:
    """`mpirun -n N spmd_serve` on free ports; use as a context manager."""

    def __init__(self, n: int, model_dir: str | None, log_path: Path, **env: str) -> None:
        self.http_port, self.health_port, metrics_port, grpc_port, inter_proc_port = free_ports(5)
        self.env = mpi_env(
            MP_NUM=str(n),
            SERVICE_HTTP_PORT=str(self.http_port),
            HEALTH_HTTP_PORT=str(self.health_port),
            HOST="127.0.0.1",
            METRICS_HTTP_PORT=str(metrics_port),
            SERVICE_GRPC_PORT=str(grpc_port),
            INTER_PROC_PORT=str(inter_proc_port),
            **env,
        )
        if model_dir:
            self.env["MODEL_DIR"] = str(model_dir)
        self.cmd = mpirun(n, str(VENV_BIN / "spmd_serve"))
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/chat/completions"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        _started.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if requests.get(f"http://127.0.0.1:{self.health_port}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rank_pids(self) -> list[int]:
        """PIDs of the spmd_serve rank processes (children of mpirun)."""
        return children(self.proc.pid)

    def http_worker_pids(self) -> list[int]:
        """PIDs of the HTTP worker processes (children of rank 0)."""
        return children(rank_pid(self, 0))

    def stop(self, timeout: float = 30.0) -> int | None:
        """End the job quickly: rank 0 asked as `stop_server` asks it (SIGTERM; a second one aborts
        what is still in flight), which ends every rank in ~0.2 s.  Only when rank 0 does not
        answer, SIGTERM to mpirun's group, then SIGKILL to its whole session: mpirun's own SIGTERM
        handling waits ~1 s per stage before it kills, 2 s a server, and the suite starts dozens."""
        if self.proc is None or self.proc.poll() is not None:
            _started.discard(self)
            return self.proc.returncode if self.proc else None
        try:
            if self._ask_rank0():
                return self.proc.returncode
            os.killpg(self.proc.pid, signal.SIGTERM)
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_session(self.proc.pid)
            return self.proc.wait(10)
        finally:
            self._log.close()
            if self.proc.poll() is not None:  # else atexit still kills it
                _started.discard(self)

    def _ask_rank0(self) -> bool:
        """SIGTERM to rank 0, then a second one if the job is still there: True once mpirun exited."""
        try:
            pid = rank_pid(self, 0)
        except LookupError:  # not started yet, or already gone
            return False
        for wait in (1.0, 4.0):
            try:
                os.kill(pid, signal.SIGTERM)
                self.proc.wait(wait)
                return True
            except ProcessLookupError:
                return self.proc.poll() is not None
            except subprocess.TimeoutExpired:
                pass
        return False

    def stop_gracefully(self, timeout: float = 30.0) -> int | None:
        """SIGTERM to rank 0 only: it stops every rank with a SHUTDOWN plan and mpirun exits 0.
        (SIGTERM to mpirun also stops the ranks cleanly, but mpirun then exits 1.)"""
        os.kill(rank_pid(self, 0), signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.stop()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def rank_pid(server: ServerProcess, rank: int) -> int:
    """PID of MPI rank `rank` (read from the ranks' environments)."""
    for pid in server.rank_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return pid
    raise LookupError(f"no rank {rank} among {server.rank_pids()}")


class Stream:
    """A native streaming request (max_dec_len tokens exactly) read in a thread as frames arrive."""

    def __init__(self, url: str, max_dec_len: int, req_id: str = "") -> None:
        body = {
            "text": "Tell me a long story.",
            "max_dec_len": max_dec_len,
            "min_dec_len": max_dec_len,
            "stream": True,
            "req_id": req_id or f"long-{max_dec_len}",
        }
        self.res = requests.post(url, json=body, stream=True, timeout=120)
        assert self.res.status_code == 200, self.res.text
        self.frames: queue.Queue[dict] = queue.Queue()
        self.all: list[dict] = []
        self.ended_at: float | None = None
        self.cut: Exception | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.res.iter_lines():
                if line:
                    self.frames.put(json.loads(line))
        except requests.RequestException as e:  # the connection was cut: no final frame
            self.cut = e
        self.ended_at = time.monotonic()

    def first(self) -> dict:
        frame = self.frames.get(timeout=60)
        self.all.append(frame)
        return frame

    def rest(self, timeout: float) -> list[dict]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "stream did not end"
        while not self.frames.empty():
            self.all.append(self.frames.get())
        return self.all


def greedy_ids(url: str, prompt_ids: list[int], n: int) -> list[int]:
    res = requests.post(
        url, json={"input_ids": prompt_ids, "max_dec_len": n, "min_dec_len": n, "temperature": 0}, timeout=120
    )
    assert res.status_code == 200, res.text
    return res.json()["tokens_all_ids"]
