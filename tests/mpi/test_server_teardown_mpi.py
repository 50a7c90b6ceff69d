"""Test servers never outlive their test run: Open MPI puts every rank in a process group of its
own, so a server is killed by session (tests/support/server_process.kill_session), and a pytest
ended by SIGTERM still kills the servers it started (tests/support/teardown_on_sigterm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.remote_harness import wait_for
from tests.support.server_process import kill_session, mpi_env

ROOT = Path(__file__).resolve().parents[2]
JOB = ["mpirun", "-n", "2", "--oversubscribe", "sleep", "120"]


def session_members(sid: int) -> list[int]:  # a pgrep each: polled every 0.1 s
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_killing_the_session_ends_ranks_that_mpirun_put_in_groups_of_their_own():
    proc = subprocess.Popen(JOB, env=mpi_env(), start_new_session=True)
    try:
        wait_for(lambda: len(session_members(proc.pid)) >= 3, 60, "mpirun starting its ranks", poll=0.1)
        ranks = [p for p in session_members(proc.pid) if p != proc.pid]
        assert all(os.getpgid(p) != proc.pid for p in ranks)  # why killpg(mpirun) is not enough
        kill_session(proc.pid)
        proc.wait(10)
        wait_for(lambda: session_members(proc.pid) == [], 10, "the end of every process of the session", poll=0.1)
    finally:
        kill_session(proc.pid)


def test_a_pytest_stopped_by_sigterm_leaves_no_server_behind(tmp_path):
    started = tmp_path / "sid"
    (tmp_path / "test_job.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess, time
            from pathlib import Path
            from tests.support import server_process

            def test_a_job_that_outlives_its_test(tmp_path):
                server = server_process.ServerProcess(2, None, tmp_path / "log")
                server._log = open(server.log_path, "wb")
                server.proc = subprocess.Popen({JOB!r}, env=server.env, start_new_session=True)
                server_process._started.add(server)  # as start() does, without the health wait
                Path({str(started)!r}).write_text(str(server.proc.pid))
                time.sleep(120)
            """
        )
    )
    env = dict(mpi_env(), PYTHONPATH=str(ROOT))
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.teardown_on_sigterm",
            "-q",
            str(tmp_path / "test_job.py"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    sid = None
    try:
        wait_for(
            lambda: started.exists() and started.read_text() != "", 60, "the inner test starting its job", poll=0.1
        )
        sid = int(started.read_text())
        wait_for(lambda: len(session_members(sid)) >= 3, 60, "mpirun starting its ranks", poll=0.1)
        runner.send_signal(signal.SIGTERM)
        out = runner.communicate(timeout=60)[0].decode(errors="replace")
        assert "KeyboardInterrupt" in out, out
        wait_for(lambda: session_members(sid) == [], 10, "the end of every process the inner test started", poll=0.1)
    finally:
        runner.kill()
        if sid is not None:
            kill_session(sid)
