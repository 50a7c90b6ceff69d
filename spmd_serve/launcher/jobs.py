"""A started job's bookkeeping: the pid file in LOG_DIR, finding the job's processes, stopping it.

Open MPI 4.1 puts every rank in a process group of its own, so "mpirun's process group" does not
contain the ranks, and a pid alone can be reused by an unrelated process after a crash.  So
`start_server` gives each job a random run id in the environment of mpirun (the ranks inherit it)
and records it in the pid file; a process belongs to the job exactly when its environment holds
that id.  Nothing else on the machine is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

PID_FILE = "server.pid"
RUN_ID_VAR = "SPMD_SERVE_RUN_ID"
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


@dataclass(frozen=True)
class Job:
    """What the pid file records: mpirun's pid (first line, so `kill $(head -1 server.pid)` works)
    and the run id that marks the job's processes."""

    pid: int
    run_id: str

    @staticmethod
    def new_run_id() -> str:
        return uuid.uuid4().hex


def pid_path(log_dir: Path) -> Path:
    return log_dir / PID_FILE


def write_pid_file(log_dir: Path, job: Job) -> None:
    tmp = pid_path(log_dir).with_suffix(".pid.tmp")
    tmp.write_text(f"{job.pid}\nrun_id={job.run_id}\n")
    os.replace(tmp, pid_path(log_dir))


def read_pid_file(log_dir: Path) -> Job | None:
    """The recorded job, or None when there is no pid file.  A malformed file reads as a job with
    no run id (no process can match it, so it is reported and removed as stale)."""
    try:
        lines = pid_path(log_dir).read_text().split()
    except FileNotFoundError:
        return None
    pid = int(lines[0]) if lines and lines[0].isdigit() else -1
    run_id = next((ln.split("=", 1)[1] for ln in lines[1:] if ln.startswith("run_id=")), "")
    return Job(pid, run_id)


def remove_pid_file(log_dir: Path) -> None:
    pid_path(log_dir).unlink(missing_ok=True)


def is_alive(p: psutil.Process) -> bool:
    """Running and not a zombie; False once it is gone (also when it is reaped between the checks)."""
    # An exited mpirun whose parent (start_server) is gone may stay a zombie if nothing reaps it.
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def job_processes(job: Job) -> list[psutil.Process]:
    """Live processes whose environment carries the job's run id (mpirun and every local rank)."""
    if not job.run_id:
        return []
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_ID_VAR) == job.run_id and is_alive(p):
                found.append(p)
        except psutil.Error:  # gone meanwhile, or another user's process we may not read
            continue
    return found


def rank_of(p: psutil.Process) -> int | None:
    try:
        env = p.environ()
    except psutil.Error:
        return None
    for var in _RANK_VARS:
        if env.get(var, "").isdigit():
            return int(env[var])
    return None


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to `timeout` s for the processes to end; returns those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if is_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


ABORT_GRACE_S = 10.0  # after a second SIGTERM rank 0 fails what is in flight and stops every rank


@dataclass
class StopResult:
    found: int  # processes of the job found running
    outcome: str  # "drained" | "aborted" (second SIGTERM) | "killed" (SIGKILL needed)
    killed: int  # processes that needed SIGKILL
    seconds: float

    @property
    def graceful(self) -> bool:
        """Everything ended after the first SIGTERM, within the timeout."""
        return self.outcome == "drained"


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):  # ended meanwhile: fine
            p.send_signal(sig)


def stop_job(job: Job, timeout: float, abort_grace: float = ABORT_GRACE_S) -> StopResult:
    """SIGTERM to rank 0: it drains (503 to new requests, in-flight ones finish), then ends every
    rank with a SHUTDOWN plan and mpirun exits 0 (SIGTERM to mpirun itself would make it exit 1).
    Still running after `timeout`: a second SIGTERM makes rank 0 abort what is in flight (error
    frames) and stop now.  Still running `abort_grace` later (a rank stuck or dead): SIGKILL
    whatever of the job is left."""
    t0 = time.monotonic()
    procs = job_processes(job)
    if not procs:
        return StopResult(0, "drained", 0, 0.0)
    rank0 = [p for p in procs if rank_of(p) == 0]
    targets = rank0 or [p for p in procs if p.pid == job.pid] or procs  # ranks not up yet: mpirun
    _signal(targets, signal.SIGTERM)
    left, outcome = wait_gone(procs, timeout), "drained"
    if left:
        outcome = "aborted"
        _signal([p for p in targets if p in left], signal.SIGTERM)
        left = wait_gone(left, abort_grace)
    if left:
        outcome = "killed"
        _signal(left, signal.SIGKILL)
    still = wait_gone(left, 10.0)
    if still:
        raise RuntimeError(f"processes {[p.pid for p in still]} survived SIGKILL")
    return StopResult(len(procs), outcome, len(left), time.monotonic() - t0)
