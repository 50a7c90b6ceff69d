"""`stop_server [timeout_s]`: stop what `start_server` started from this LOG_DIR (CONTRACT §1).

SIGTERM goes to rank 0, which stops admitting (503) and lets in-flight requests finish; still running
after `timeout_s` (default 60), a second SIGTERM makes it abort what is left with an error frame and
stop; still running 10 s later (a rank stuck or dead), whatever of the job is left is killed.  Which
of the three happened is printed.  The pid file is removed in every case; a pid file whose job is gone
(it crashed, or a rank died and mpirun ended it) is reported as stale, with the cause from server.log,
and cleaned up.  The server's own drain limit is SPMD_DRAIN_TIMEOUT_S (default 60 s): rank 0 aborts
what is in flight after it even when stop_server would wait longer.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from spmd_serve.launcher.jobs import ABORT_GRACE_S, job_processes, pid_path, read_pid_file, remove_pid_file, stop_job
from spmd_serve.launcher.settings import log_dir_from_env

# Lines in server.log that say why a job ended on its own: mpirun naming a rank that died or
# failed, a rank's fatal error, a start-up error, rank 0 seeing a rank vanish.
_CAUSE = re.compile(
    r"mpirun noticed that|fatal error on rank|spmd_serve: error:|exited unexpectedly"
    r"|MPI_ABORT was invoked"
)


def _say(msg: str) -> None:
    print(f"stop_server: {msg}", flush=True)


def last_cause(log_path: Path, tail_bytes: int = 256 * 1024) -> str | None:
    """The last line of the log that says why the job ended, if there is one."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    return next((ln.strip() for ln in reversed(lines) if _CAUSE.search(ln)), None)


def stop(log_dir: Path, timeout: float) -> int:
    job = read_pid_file(log_dir)
    log_path = log_dir / "server.log"
    if job is None:
        _say(f"no server is running from LOG_DIR={log_dir} (no {pid_path(log_dir)}); nothing to stop")
        return 0
    if not job_processes(job):
        remove_pid_file(log_dir)
        cause = last_cause(log_path)
        _say(
            f"the server is not running: it exited or was killed (mpirun pid {job.pid}); "
            f"see {log_path}" + (f"; it says: {cause}" if cause else "")
        )
        _say(f"removed the stale pid file {pid_path(log_dir)}")
        return 0
    _say(
        f"stopping the server (mpirun pid {job.pid}): SIGTERM to rank 0, in-flight requests may "
        f"take up to {timeout:g} s"
    )
    try:
        result = stop_job(job, timeout)
    except RuntimeError as e:
        print(f"stop_server: error: {e}", file=sys.stderr)
        return 1
    remove_pid_file(log_dir)
    if result.outcome == "drained":
        _say(f"stopped {result.found} process(es) gracefully in {result.seconds:.1f} s")
    elif result.outcome == "aborted":
        _say(
            f"the server was still draining after {timeout:g} s: a second SIGTERM made it abort the "
            f"requests in flight (error frame, 503); stopped in {result.seconds:.1f} s"
        )
    else:
        _say(
            f"the server did not stop within {timeout:g} s + {ABORT_GRACE_S:g} s after a second "
            f"SIGTERM: killed {result.killed} remaining process(es); see {log_path}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stop_server", description=__doc__.splitlines()[0])
    ap.add_argument(
        "timeout_s",
        nargs="?",
        type=float,
        default=60.0,
        help="seconds in-flight requests may take before they are aborted (default 60); "
        "what is still running 10 s after that is killed",
    )
    args = ap.parse_args(argv)
    if args.timeout_s < 0:
        ap.error(f"timeout_s must be >= 0, got {args.timeout_s:g}")
    return stop(log_dir_from_env(), args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
