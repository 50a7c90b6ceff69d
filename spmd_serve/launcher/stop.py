"""`stop_server [timeout_s]`: stop what `start_server` started from this LOG_DIR (CONTRACT §1).

SIGTERM goes to rank 0, which stops admitting (503), lets in-flight requests finish and ends every
rank; after `timeout_s` (default 60) whatever of the job is left is killed.  The pid file is removed
in every case; a pid file whose job is gone is reported as stale and cleaned up.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spmd_serve.launcher.jobs import job_processes, pid_path, read_pid_file, remove_pid_file, stop_job
from spmd_serve.launcher.settings import log_dir_from_env


def _say(msg: str) -> None:
    print(f"stop_server: {msg}", flush=True)


def stop(log_dir: Path, timeout: float) -> int:
    job = read_pid_file(log_dir)
    if job is None:
        _say(f"no server is running from LOG_DIR={log_dir} (no {pid_path(log_dir)}); nothing to stop")
        return 0
    if not job_processes(job):
        remove_pid_file(log_dir)
        _say(f"stale pid file {pid_path(log_dir)}: the server (mpirun pid {job.pid}) is no longer "
             f"running (it exited or was killed; see {log_dir / 'server.log'}); removed the pid file")
        return 0
    _say(f"stopping the server (mpirun pid {job.pid}): SIGTERM to rank 0, waiting up to {timeout:g} s")
    try:
        result = stop_job(job, timeout)
    except RuntimeError as e:
        print(f"stop_server: error: {e}", file=sys.stderr)
        return 1
    remove_pid_file(log_dir)
    if result.graceful:
        _say(f"stopped {result.found} process(es) gracefully in {result.seconds:.1f} s")
    else:
        _say(f"the server did not finish within {timeout:g} s: killed {result.killed} remaining "
             f"process(es); see {log_dir / 'server.log'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stop_server", description=__doc__.splitlines()[0])
    ap.add_argument("timeout_s", nargs="?", type=float, default=60.0,
                    help="seconds in-flight requests may take before the rest is killed (default 60)")
    args = ap.parse_args(argv)
    if args.timeout_s < 0:
        ap.error(f"timeout_s must be >= 0, got {args.timeout_s:g}")
    return stop(log_dir_from_env(), args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
